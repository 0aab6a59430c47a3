-- Deleting a node leaves a tombstone (docs/design.md, "Deleted nodes"): its reservations, usage, commands,
-- events and certificates stay for billing and audit; every live read skips it; a new token revives the id.
ALTER TABLE nodes ADD COLUMN deleted_at_ms BIGINT;
