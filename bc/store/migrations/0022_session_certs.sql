-- Session certificates (bc/pki/session_cert.py): a TPM identity's in-memory session key, certified for a day at
-- most, stored beside the node certificate it was issued against (`session_of`, that certificate's serial), so
-- that revoking the node revokes it too and the gateways' revocation feed ends its session. NULL: a node
-- certificate.
ALTER TABLE node_certs ADD COLUMN session_of TEXT;
CREATE INDEX node_certs_session_of ON node_certs (session_of) WHERE session_of IS NOT NULL;
