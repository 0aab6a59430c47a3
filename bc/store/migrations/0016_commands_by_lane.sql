-- The dispatch pass reads the head of each (node, lane) queue, as many commands as the lane has credits free
-- (bc/store/dispatch.py gateway_lane_heads): an index seek per lane, not a scan of the node's backlog.
CREATE INDEX commands_node_lane_state ON commands (node_id, lane, state, seq);
-- Commands whose cancel was requested are few: the pass's cancel reads find them without a scan of the queue.
CREATE INDEX commands_cancel_requested ON commands (node_id, state) WHERE cancel_requested_at_ms IS NOT NULL;
