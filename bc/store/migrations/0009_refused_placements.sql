-- A node that refuses a hold at admission (AllocationFailed resources-exhausted) does not fail the
-- reservation: capacity places it again, elsewhere (docs/capacity.md, "When a node refuses a hold").
-- avoid_nodes: the nodes that refused it (a JSON list), never offered it again. placement_attempts: each
-- refused placement, kept for audit and billing: its usage span ran from the placement to the refusal.
ALTER TABLE reservations ADD COLUMN avoid_nodes TEXT NOT NULL DEFAULT '[]';
CREATE TABLE placement_attempts (
  reservation_id TEXT NOT NULL REFERENCES reservations(id),
  attempt INTEGER NOT NULL,
  node_id TEXT NOT NULL,
  allocation_id TEXT NOT NULL,
  usage_start_ms BIGINT NOT NULL,
  usage_end_ms BIGINT NOT NULL,
  reason TEXT NOT NULL,
  message TEXT NOT NULL DEFAULT '',
  PRIMARY KEY (reservation_id, attempt),
  CHECK (usage_end_ms >= usage_start_ms)
);
