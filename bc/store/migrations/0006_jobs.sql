-- The job queue (docs/jobs.md): DAGs, their nodes and edges, and the resources they hold, as rows.
-- A DAG is live while settled_at_ms is NULL; the scheduler loads the live ones in submit order.
CREATE TABLE job_dags (
  id TEXT PRIMARY KEY,
  submit_seq BIGINT NOT NULL UNIQUE,
  template TEXT NOT NULL,
  args TEXT NOT NULL DEFAULT '{}',
  subjects TEXT NOT NULL DEFAULT '[]',
  local_pools TEXT NOT NULL DEFAULT '{}',
  stop_on_failure INTEGER NOT NULL DEFAULT 0,
  state TEXT NOT NULL CHECK (state IN ('queued', 'running', 'done', 'failed', 'cancelled')),
  cancel_requested INTEGER NOT NULL DEFAULT 0,
  first_error TEXT,
  requested_by TEXT NOT NULL DEFAULT '',
  reason TEXT NOT NULL DEFAULT '',
  created_at_ms BIGINT NOT NULL,
  settled_at_ms BIGINT
);
CREATE INDEX job_dags_live ON job_dags (settled_at_ms, submit_seq);
CREATE INDEX job_dags_template ON job_dags (template, settled_at_ms);

CREATE TABLE job_nodes (
  dag_id TEXT NOT NULL REFERENCES job_dags(id),
  id TEXT NOT NULL,
  pos INTEGER NOT NULL,
  kind TEXT NOT NULL,
  subject TEXT,
  params TEXT NOT NULL DEFAULT '{}',
  lease INTEGER NOT NULL DEFAULT 0,
  pools TEXT NOT NULL DEFAULT '[]',
  grp TEXT,
  tail INTEGER NOT NULL DEFAULT 0,
  state TEXT NOT NULL CHECK (state IN ('queued', 'running', 'done', 'failed', 'cancelled')),
  error TEXT,
  detail TEXT NOT NULL DEFAULT '{}',
  started_at_ms BIGINT,
  finished_at_ms BIGINT,
  PRIMARY KEY (dag_id, id)
);
CREATE INDEX job_nodes_running ON job_nodes (state, dag_id);

CREATE TABLE job_edges (
  dag_id TEXT NOT NULL REFERENCES job_dags(id),
  node_id TEXT NOT NULL,
  dep_id TEXT NOT NULL,
  kind TEXT NOT NULL CHECK (kind IN ('after_ok', 'after_any')),
  PRIMARY KEY (dag_id, node_id, dep_id)
);

-- Held resources: a subject lease per fleet node (held by a DAG until it settles) and slot holders.
CREATE TABLE job_leases (
  subject TEXT PRIMARY KEY,
  dag_id TEXT NOT NULL REFERENCES job_dags(id)
);
CREATE TABLE job_slots (
  pool_key TEXT NOT NULL,
  dag_id TEXT NOT NULL REFERENCES job_dags(id),
  node_id TEXT NOT NULL,
  PRIMARY KEY (pool_key, dag_id, node_id)
);
CREATE TABLE job_pools (
  name TEXT PRIMARY KEY,
  capacity INTEGER NOT NULL CHECK (capacity >= 1)
);
INSERT INTO job_pools (name, capacity) VALUES ('reboots', 10);
INSERT INTO job_pools (name, capacity) VALUES ('rollouts', 4);
INSERT INTO job_pools (name, capacity) VALUES ('remediations', 4);

-- A job's transient cordon: the DAG that holds the node out of placement for its run (NULL: none).
-- `cordoned` stays the operator's durable wanted state; a job's Reconcile clears only its own hold.
ALTER TABLE nodes ADD COLUMN job_hold TEXT;

-- Batches gain a state `withdrawn` (a DAG no longer needs it), the DAG that owns one (its approval
-- releases nothing: each job Command node releases its own leaf) and how the owning DAG ended.
-- A CHECK cannot be altered in SQLite, so the three quorum tables are rebuilt, children first.
CREATE TABLE batch_leaves_copy AS SELECT * FROM batch_leaves;
CREATE TABLE batch_approvals_copy AS SELECT * FROM batch_approvals;
DROP TABLE batch_leaves;
DROP TABLE batch_approvals;
CREATE TABLE batches_copy AS SELECT * FROM batches;
DROP TABLE batches;
CREATE TABLE batches (
  id TEXT PRIMARY KEY,
  kind TEXT NOT NULL,
  state TEXT NOT NULL CHECK (state IN ('pending', 'approved', 'rejected', 'withdrawn')),
  requested_by TEXT NOT NULL,
  reason TEXT NOT NULL DEFAULT '',
  payload_json TEXT NOT NULL DEFAULT '{}',
  scope_root {{BLOB}} NOT NULL,
  threshold INTEGER NOT NULL,
  approval {{BLOB}},
  created_at_ms BIGINT NOT NULL,
  not_after_ms BIGINT NOT NULL,
  settled_at_ms BIGINT,
  dag_id TEXT NOT NULL DEFAULT '',
  resolution TEXT NOT NULL DEFAULT ''
);
INSERT INTO batches (id, kind, state, requested_by, reason, payload_json, scope_root, threshold, approval,
                     created_at_ms, not_after_ms, settled_at_ms)
  SELECT id, kind, state, requested_by, reason, payload_json, scope_root, threshold, approval,
         created_at_ms, not_after_ms, settled_at_ms FROM batches_copy;
DROP TABLE batches_copy;
CREATE TABLE batch_leaves (
  batch_id TEXT NOT NULL REFERENCES batches(id),
  idx INTEGER NOT NULL,
  node_id TEXT NOT NULL,
  kind TEXT NOT NULL,
  payload_digest {{BLOB}} NOT NULL,
  command_id TEXT NOT NULL,
  PRIMARY KEY (batch_id, idx)
);
INSERT INTO batch_leaves (batch_id, idx, node_id, kind, payload_digest, command_id)
  SELECT batch_id, idx, node_id, kind, payload_digest, command_id FROM batch_leaves_copy;
DROP TABLE batch_leaves_copy;
CREATE TABLE batch_approvals (
  batch_id TEXT NOT NULL REFERENCES batches(id),
  key_id TEXT NOT NULL,
  name TEXT NOT NULL,
  decision TEXT NOT NULL CHECK (decision IN ('approve', 'reject')),
  signature {{BLOB}} NOT NULL,
  expires_at_ms BIGINT NOT NULL DEFAULT 0,
  reason TEXT NOT NULL DEFAULT '',
  at_ms BIGINT NOT NULL,
  operator TEXT NOT NULL DEFAULT '',
  PRIMARY KEY (batch_id, key_id)
);
INSERT INTO batch_approvals (batch_id, key_id, name, decision, signature, expires_at_ms, reason, at_ms, operator)
  SELECT batch_id, key_id, name, decision, signature, expires_at_ms, reason, at_ms, operator FROM batch_approvals_copy;
DROP TABLE batch_approvals_copy;

-- Bumped by every scheduler step: it serializes steps across processes (PostgreSQL takes the row lock)
-- and tells a process whether the world it holds in memory is still the stored one.
CREATE TABLE job_meta (
  id INTEGER PRIMARY KEY CHECK (id = 1),
  version BIGINT NOT NULL
);
INSERT INTO job_meta (id, version) VALUES (1, 0);
