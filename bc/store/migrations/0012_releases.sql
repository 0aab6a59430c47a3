-- Self-update (docs/self-update.md): the keys that sign releases, and the signed release records.
CREATE TABLE release_keys (
  key_id TEXT PRIMARY KEY,
  public_key {{BLOB}} NOT NULL,
  added_by TEXT NOT NULL DEFAULT '',
  added_at_ms BIGINT NOT NULL
);

-- A release is published once per version; its sequence (assigned here) orders releases and is the floor a
-- confirmed one raises on a node. `path` is set when bc serve keeps the file itself (then `url` is where it
-- serves it); empty when the release lives at an operator's https URL.
CREATE TABLE releases (
  sequence BIGINT PRIMARY KEY,
  version TEXT NOT NULL UNIQUE,
  sha256 TEXT NOT NULL,
  size BIGINT NOT NULL,
  signature {{BLOB}} NOT NULL,
  key_id TEXT NOT NULL,
  url TEXT NOT NULL DEFAULT '',
  path TEXT NOT NULL DEFAULT '',
  published_by TEXT NOT NULL DEFAULT '',
  published_at_ms BIGINT NOT NULL
);
