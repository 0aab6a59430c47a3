-- One-shot commands (reference: "Commands"). `body` is the serialized CommandBody, written once at
-- enqueue and resent verbatim with `signature`; the columns beside it are copies of body fields that
-- the queries need (seq, kind, lane, not_after, flags), never re-encoded into a body.
-- `result` and `node_sig` are stored exactly as the node reported them.
CREATE TABLE commands (
  id TEXT PRIMARY KEY,
  node_id TEXT NOT NULL REFERENCES nodes(node_id),
  seq BIGINT NOT NULL,
  kind TEXT NOT NULL,
  lane TEXT NOT NULL,
  body {{BLOB}} NOT NULL,
  signature {{BLOB}},
  state TEXT NOT NULL DEFAULT 'pending'
    CHECK (state IN ('pending', 'dispatched', 'acked', 'running',
                     'succeeded', 'failed', 'rejected', 'cancelled', 'expired')),
  reason TEXT NOT NULL DEFAULT '',
  message TEXT NOT NULL DEFAULT '',
  result {{BLOB}},
  node_sig {{BLOB}},
  boot_id TEXT NOT NULL DEFAULT '',
  not_before_ms BIGINT NOT NULL DEFAULT 0,
  not_after_ms BIGINT NOT NULL,
  min_generation BIGINT NOT NULL DEFAULT 0,
  idempotency_key TEXT NOT NULL,
  retry_safe INTEGER NOT NULL DEFAULT 0,
  self_terminating INTEGER NOT NULL DEFAULT 0,
  attested INTEGER NOT NULL DEFAULT 0,
  dispatched_epoch BIGINT,
  attempt INTEGER NOT NULL DEFAULT 0,
  cancel_requested_at_ms BIGINT,
  cancel_reason TEXT NOT NULL DEFAULT '',
  cancel_sent_epoch BIGINT,
  batch_id TEXT NOT NULL DEFAULT '',
  created_at_ms BIGINT NOT NULL,
  updated_at_ms BIGINT NOT NULL,
  settled_at_ms BIGINT,
  UNIQUE (node_id, seq),
  UNIQUE (node_id, idempotency_key)
);

-- Dispatch and replay: a node's pending or in-flight commands in seq order.
CREATE INDEX commands_node_state ON commands (node_id, state, seq);

-- The sweeper: pending and in-flight commands past their deadline.
CREATE INDEX commands_state_deadline ON commands (state, not_after_ms);
