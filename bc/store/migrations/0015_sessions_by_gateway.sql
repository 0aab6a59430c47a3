-- The per-gateway dispatch (bc/store/dispatch.py) and the gateway-loss grace read the sessions a gateway
-- holds: at thousands of nodes a scan of every session per pass, without this index.
CREATE INDEX node_sessions_gateway ON node_sessions (gateway_id, open);
