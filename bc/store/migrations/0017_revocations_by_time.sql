-- The gateways' revocation feed polls what was revoked since its last look (bc/store/revocation.py
-- revoked_since): an index seek over the few revoked certificates, not a lookup per open session.
CREATE INDEX node_certs_revoked ON node_certs (revoked_at_ms) WHERE revoked_at_ms IS NOT NULL;
