-- Named operators with roles, who asked for each write, and changes of the quorum settings (docs/quorum.md).
CREATE TABLE operators (
  name TEXT PRIMARY KEY,
  role TEXT NOT NULL CHECK (role IN ('admin', 'operator', 'viewer')),
  created_at_ms BIGINT NOT NULL,
  created_by TEXT NOT NULL DEFAULT '',
  revoked_at_ms BIGINT,
  revoked_by TEXT NOT NULL DEFAULT '',
  revoke_reason TEXT NOT NULL DEFAULT ''
);

-- Every operator certificate the CA issued: a call is taken only under a registered serial of a live operator.
CREATE TABLE operator_certs (
  serial TEXT PRIMARY KEY,
  name TEXT NOT NULL REFERENCES operators(name),
  not_after_ms BIGINT NOT NULL,
  issued_at_ms BIGINT NOT NULL
);
CREATE INDEX operator_certs_name ON operator_certs (name);

-- The operator `bc serve` made at its first start is an admin; `bc serve` registers its certificate.
INSERT INTO operators (name, role, created_at_ms, created_by) VALUES ('local', 'admin', 0, 'bc serve');

-- Each approver key belongs to one operator ('' for a key added before operators existed).
ALTER TABLE approvers ADD COLUMN operator TEXT NOT NULL DEFAULT '';
ALTER TABLE batch_approvals ADD COLUMN operator TEXT NOT NULL DEFAULT '';
ALTER TABLE commands ADD COLUMN requested_by TEXT NOT NULL DEFAULT '';

-- A change of the approver set, k or the unbatched allowance: pending until min(k, n) current approvers sign.
CREATE TABLE quorum_changes (
  id TEXT PRIMARY KEY,
  state TEXT NOT NULL CHECK (state IN ('pending', 'applied', 'rejected', 'superseded')),
  requested_by TEXT NOT NULL,
  summary TEXT NOT NULL,
  from_settings {{BLOB}} NOT NULL,
  to_settings {{BLOB}} NOT NULL,
  threshold INTEGER NOT NULL,
  to_version BIGINT NOT NULL,
  approval {{BLOB}},
  created_at_ms BIGINT NOT NULL,
  not_after_ms BIGINT NOT NULL,
  settled_at_ms BIGINT
);
CREATE INDEX quorum_changes_state ON quorum_changes (state, created_at_ms);

CREATE TABLE quorum_change_decisions (
  change_id TEXT NOT NULL REFERENCES quorum_changes(id),
  key_id TEXT NOT NULL,
  name TEXT NOT NULL,
  operator TEXT NOT NULL,
  decision TEXT NOT NULL CHECK (decision IN ('approve', 'reject')),
  signature {{BLOB}} NOT NULL,
  reason TEXT NOT NULL DEFAULT '',
  at_ms BIGINT NOT NULL,
  PRIMARY KEY (change_id, key_id)
);
