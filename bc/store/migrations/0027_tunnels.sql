-- Tunnels (docs/access.md): the exec-ticket signing keys' public halves (the private halves live beside the
-- CA, in <data-dir>/pki/exec-tickets/, never in the store), and one row per ticket issued: who, which node,
-- why, and the tunnel it opened (start, end, bytes, exit code). Nodes pin the live keys' JWKS in `access`.
CREATE TABLE exec_ticket_keys (
  kid TEXT PRIMARY KEY,
  public_jwk TEXT NOT NULL,
  created_by TEXT NOT NULL DEFAULT '',
  created_at_ms BIGINT NOT NULL,
  retired_at_ms BIGINT
);

CREATE TABLE tunnel_sessions (
  sid TEXT PRIMARY KEY,
  jti TEXT NOT NULL UNIQUE,
  node_id TEXT NOT NULL,
  operator TEXT NOT NULL,
  purpose TEXT NOT NULL,
  port INTEGER NOT NULL,
  reason TEXT NOT NULL DEFAULT '',
  kid TEXT NOT NULL,
  state TEXT NOT NULL CHECK (state IN ('issued', 'open', 'closed', 'refused', 'expired')),
  gateway_id TEXT NOT NULL DEFAULT '',
  issued_at_ms BIGINT NOT NULL,
  expires_at_ms BIGINT NOT NULL,
  opened_at_ms BIGINT,
  ended_at_ms BIGINT,
  bytes_up BIGINT NOT NULL DEFAULT 0,
  bytes_down BIGINT NOT NULL DEFAULT 0,
  exit_code INTEGER,
  end_reason TEXT NOT NULL DEFAULT ''
);
CREATE INDEX tunnel_sessions_by_node ON tunnel_sessions (node_id, issued_at_ms);
CREATE INDEX tunnel_sessions_by_state ON tunnel_sessions (state);
