-- Roles and keys (docs/fleet.md): a gateway-only `bc serve` holds no CA key and no signing key.
-- Its serving certificate is asked for here (a CSR for the hosts it serves) and issued here by an api
-- process, which holds the CA; `issued_at_ms < requested_at_ms` (or NULL) is a request still waiting.
CREATE TABLE serving_certs (
  gateway_id TEXT PRIMARY KEY,
  hosts TEXT NOT NULL,
  csr_pem TEXT NOT NULL,
  requested_at_ms BIGINT NOT NULL,
  cert_pem TEXT,
  issued_at_ms BIGINT,
  not_after_ms BIGINT
);

-- What key-holding processes publish for keyless ones to relay verbatim: the CA certificate (`ca.pem`),
-- the trust bundle nodes hold (`trust.bundle`) and its signed envelope (`trust.envelope`).
CREATE TABLE published_trust (
  name TEXT PRIMARY KEY,
  value {{BLOB}} NOT NULL,
  updated_at_ms BIGINT NOT NULL
);

-- Where api processes answer (a gateway proxies Join.Renew there); a row lives while its process renews it.
CREATE TABLE api_endpoints (
  holder TEXT PRIMARY KEY,
  address TEXT NOT NULL,
  expires_at_ms BIGINT NOT NULL
);

-- A spec generation written by a process without the worker key (a gateway applying an allocation report)
-- waits here unsigned until a key-holding process signs it; gateways deliver no spec while it is 1.
ALTER TABLE nodes ADD COLUMN spec_sign_pending INTEGER NOT NULL DEFAULT 0;
