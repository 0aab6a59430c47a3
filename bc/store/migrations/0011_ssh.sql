-- Break-glass SSH (docs/ssh.md): the SSH user CA whose public key every node's access section carries (its
-- key in the data dir, or offline: then the operator's CLI signs and the server records), and
-- the certificates it issued (grants), each with who asked and why, revocable by serial.
CREATE TABLE ssh_ca (
  id INTEGER PRIMARY KEY CHECK (id = 1),
  public_key TEXT NOT NULL,
  fingerprint TEXT NOT NULL,
  offline INTEGER NOT NULL DEFAULT 0,
  created_by TEXT NOT NULL DEFAULT '',
  created_at_ms BIGINT NOT NULL
);

-- A grant: the certificate for principal@node on one user key. A destructive principal (root) waits for
-- its batch's quorum (state 'pending', batch_id set) before the certificate is signed ('issued'); a
-- rejected or expired batch makes it 'refused'. Under an offline CA a grant stays 'pending' with its window set
-- until the operator's signed certificate is recorded. Serials are unique for the CA's life.
CREATE TABLE ssh_grants (
  serial BIGINT PRIMARY KEY,
  node_id TEXT NOT NULL,
  principal TEXT NOT NULL,
  public_key TEXT NOT NULL,
  fingerprint TEXT NOT NULL,
  ttl_s BIGINT NOT NULL,
  state TEXT NOT NULL CHECK (state IN ('pending', 'issued', 'refused')),
  batch_id TEXT NOT NULL DEFAULT '',
  certificate TEXT NOT NULL DEFAULT '',
  valid_after_ms BIGINT NOT NULL DEFAULT 0,
  valid_before_ms BIGINT NOT NULL DEFAULT 0,
  requested_by TEXT NOT NULL DEFAULT '',
  reason TEXT NOT NULL DEFAULT '',
  created_at_ms BIGINT NOT NULL,
  revoked_at_ms BIGINT,
  revoked_by TEXT NOT NULL DEFAULT '',
  revoke_reason TEXT NOT NULL DEFAULT ''
);
CREATE INDEX ssh_grants_node ON ssh_grants (node_id, state);
CREATE INDEX ssh_grants_batch ON ssh_grants (batch_id);
