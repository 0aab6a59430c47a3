-- A quorum change gains the state `withdrawn`: its proposer took it back (docs/quorum.md). A CHECK cannot be
-- altered in SQLite, so the change tables are rebuilt, children first; the columns keep their order.
CREATE TABLE quorum_change_decisions_copy AS SELECT * FROM quorum_change_decisions;
DROP TABLE quorum_change_decisions;
CREATE TABLE quorum_changes_copy AS SELECT * FROM quorum_changes;
DROP TABLE quorum_changes;
CREATE TABLE quorum_changes (
  id TEXT PRIMARY KEY,
  state TEXT NOT NULL CHECK (state IN ('pending', 'applied', 'rejected', 'superseded', 'withdrawn')),
  requested_by TEXT NOT NULL,
  summary TEXT NOT NULL,
  from_settings {{BLOB}} NOT NULL,
  to_settings {{BLOB}} NOT NULL,
  threshold INTEGER NOT NULL,
  to_version BIGINT NOT NULL,
  approval {{BLOB}},
  created_at_ms BIGINT NOT NULL,
  not_after_ms BIGINT NOT NULL,
  settled_at_ms BIGINT,
  root_signature {{BLOB}}
);
INSERT INTO quorum_changes (id, state, requested_by, summary, from_settings, to_settings, threshold, to_version,
                            approval, created_at_ms, not_after_ms, settled_at_ms, root_signature)
  SELECT id, state, requested_by, summary, from_settings, to_settings, threshold, to_version,
         approval, created_at_ms, not_after_ms, settled_at_ms, root_signature FROM quorum_changes_copy;
DROP TABLE quorum_changes_copy;
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
INSERT INTO quorum_change_decisions (change_id, key_id, name, operator, decision, signature, reason, at_ms)
  SELECT change_id, key_id, name, operator, decision, signature, reason, at_ms FROM quorum_change_decisions_copy;
DROP TABLE quorum_change_decisions_copy;
