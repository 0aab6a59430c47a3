-- The secret broker (docs/secrets.md). A secret's row holds its name, its newest version and its scope;
-- each version's value is sealed (AES-256-GCM) under the at-rest key beside the CA (bc.pki.secret_box),
-- which is not in the store: a dump of these tables holds ciphertext only.
CREATE TABLE secrets (
  name TEXT PRIMARY KEY,
  version INTEGER NOT NULL,
  scope_nodes TEXT NOT NULL DEFAULT '[]',
  scope_labels TEXT NOT NULL DEFAULT '[]',
  created_by TEXT NOT NULL DEFAULT '',
  created_at_ms BIGINT NOT NULL,
  updated_by TEXT NOT NULL DEFAULT '',
  updated_at_ms BIGINT NOT NULL
);

CREATE TABLE secret_versions (
  name TEXT NOT NULL,
  version INTEGER NOT NULL,
  sealed {{BLOB}} NOT NULL,
  key_id TEXT NOT NULL,
  set_by TEXT NOT NULL DEFAULT '',
  set_at_ms BIGINT NOT NULL,
  PRIMARY KEY (name, version)
);
