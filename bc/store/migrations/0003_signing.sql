-- Signed intent (reference: "Signed commands and attested results"). Each stored signature names the
-- worker key that made it; the worker certificates themselves live here so that any gateway can relay
-- the signer's certificate with the stored bytes without holding a key.
CREATE TABLE signing_certs (
  key_id TEXT PRIMARY KEY,
  cert_der {{BLOB}} NOT NULL,
  not_after_ms BIGINT NOT NULL,
  created_at_ms BIGINT NOT NULL
);

ALTER TABLE commands ADD COLUMN signer_key_id TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN spec_key_id TEXT NOT NULL DEFAULT '';
