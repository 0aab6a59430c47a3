-- A release's signature covers its name, version, sequence, platform and digest (bc.pki.releases.Release), and
-- sequences count per release name: the table is rebuilt keyed by (name, sequence), a version published once per
-- name. Rows from before keep their sequences under the name 'bc' with an empty platform: signed the old way,
-- nodes refuse them and they are published again (a new publish of the same version replaces such a row).
CREATE TABLE releases_v2 (
  name TEXT NOT NULL,
  sequence BIGINT NOT NULL,
  version TEXT NOT NULL,
  platform TEXT NOT NULL DEFAULT '',
  sha256 TEXT NOT NULL,
  size BIGINT NOT NULL,
  signature {{BLOB}} NOT NULL,
  key_id TEXT NOT NULL,
  url TEXT NOT NULL DEFAULT '',
  path TEXT NOT NULL DEFAULT '',
  published_by TEXT NOT NULL DEFAULT '',
  published_at_ms BIGINT NOT NULL,
  PRIMARY KEY (name, sequence),
  UNIQUE (name, version)
);
INSERT INTO releases_v2 (name, sequence, version, platform, sha256, size, signature, key_id, url, path, published_by,
  published_at_ms)
  SELECT 'bc', sequence, version, '', sha256, size, signature, key_id, url, path, published_by, published_at_ms
  FROM releases;
DROP TABLE releases;
ALTER TABLE releases_v2 RENAME TO releases;
