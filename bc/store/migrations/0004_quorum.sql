-- The destructive-batch quorum (reference: "The destructive-batch quorum"; docs/quorum.md).
CREATE TABLE approvers (
  key_id TEXT PRIMARY KEY,
  name TEXT NOT NULL UNIQUE,
  public_key {{BLOB}} NOT NULL,
  added_at_ms BIGINT NOT NULL
);

-- A batch: its leaves (node, kind, payload digest), their Merkle root, and what approvers decided.
CREATE TABLE batches (
  id TEXT PRIMARY KEY,
  kind TEXT NOT NULL,
  state TEXT NOT NULL CHECK (state IN ('pending', 'approved', 'rejected')),
  requested_by TEXT NOT NULL,
  reason TEXT NOT NULL DEFAULT '',
  payload_json TEXT NOT NULL DEFAULT '{}',
  scope_root {{BLOB}} NOT NULL,
  threshold INTEGER NOT NULL,
  approval {{BLOB}},
  created_at_ms BIGINT NOT NULL,
  not_after_ms BIGINT NOT NULL,
  settled_at_ms BIGINT
);

CREATE TABLE batch_leaves (
  batch_id TEXT NOT NULL REFERENCES batches(id),
  idx INTEGER NOT NULL,
  node_id TEXT NOT NULL,
  kind TEXT NOT NULL,
  payload_digest {{BLOB}} NOT NULL,
  command_id TEXT NOT NULL,
  PRIMARY KEY (batch_id, idx)
);

CREATE TABLE batch_approvals (
  batch_id TEXT NOT NULL REFERENCES batches(id),
  key_id TEXT NOT NULL,
  name TEXT NOT NULL,
  decision TEXT NOT NULL CHECK (decision IN ('approve', 'reject')),
  signature {{BLOB}} NOT NULL,
  expires_at_ms BIGINT NOT NULL DEFAULT 0,
  reason TEXT NOT NULL DEFAULT '',
  at_ms BIGINT NOT NULL,
  PRIMARY KEY (batch_id, key_id)
);

-- A batch's commands wait `held` until the batch is approved; each then carries its leaf's proof.
ALTER TABLE commands ADD COLUMN held INTEGER NOT NULL DEFAULT 0;
ALTER TABLE commands ADD COLUMN batch_proof {{BLOB}};
