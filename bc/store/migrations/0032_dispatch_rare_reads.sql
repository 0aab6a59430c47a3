-- The dispatch pass's two reads of rare commands (bc/store/dispatch.py) start from those commands, not from the
-- whole pending queue: a cancelled command still pending, and a pending one whose `not_before` is ahead. With
-- only the (state) and (node_id, state) indexes, SQLite's planner read every pending command for both: 13 ms
-- and 20 ms with 3,000 queued on one node, the first once per command when a pass follows each result.
CREATE INDEX commands_cancel_by_state ON commands (state, node_id, seq) WHERE cancel_requested_at_ms IS NOT NULL;
CREATE INDEX commands_pending_not_before ON commands (not_before_ms) WHERE state = 'pending' AND held = 0;
