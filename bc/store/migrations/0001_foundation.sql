-- Nodes, their desired state and where they stand (reference: "Generations").
CREATE TABLE nodes (
  node_id TEXT PRIMARY KEY,
  role TEXT NOT NULL DEFAULT 'node',
  created_at_ms BIGINT NOT NULL,
  identity_generation BIGINT NOT NULL DEFAULT 1,
  spec TEXT NOT NULL DEFAULT '{}',
  spec_hash TEXT NOT NULL DEFAULT '',
  spec_body {{BLOB}},
  spec_signature {{BLOB}},
  generation BIGINT NOT NULL DEFAULT 0,
  applied_generation BIGINT NOT NULL DEFAULT 0,
  applied_spec_hash TEXT NOT NULL DEFAULT '',
  observed_generation BIGINT NOT NULL DEFAULT 0,
  next_cmd_seq BIGINT NOT NULL DEFAULT 1,
  labels TEXT NOT NULL DEFAULT '{}',
  cordoned INTEGER NOT NULL DEFAULT 0,
  connectivity TEXT NOT NULL DEFAULT 'new',
  connectivity_since_ms BIGINT,
  connectivity_reason TEXT NOT NULL DEFAULT '',
  last_seen_ms BIGINT,
  status TEXT NOT NULL DEFAULT '{}',
  inventory TEXT NOT NULL DEFAULT '{}',
  inventory_hash TEXT NOT NULL DEFAULT '',
  capabilities TEXT NOT NULL DEFAULT '[]'
);

-- Which gateway routes a node, under which epoch (the fence of every routing write).
CREATE TABLE node_sessions (
  node_id TEXT PRIMARY KEY REFERENCES nodes(node_id) ON DELETE CASCADE,
  gateway_id TEXT NOT NULL,
  session_epoch BIGINT NOT NULL,
  open INTEGER NOT NULL DEFAULT 1,
  journal_id TEXT NOT NULL DEFAULT '',
  boot_id TEXT NOT NULL DEFAULT '',
  incarnation_id TEXT NOT NULL DEFAULT '',
  cert_serial TEXT NOT NULL DEFAULT '',
  acked_event_seq BIGINT NOT NULL DEFAULT 0,
  opened_at_ms BIGINT NOT NULL,
  closed_at_ms BIGINT
);

CREATE TABLE node_certs (
  serial TEXT PRIMARY KEY,
  node_id TEXT NOT NULL,
  identity_generation BIGINT NOT NULL,
  cert_pem TEXT NOT NULL,
  issued_at_ms BIGINT NOT NULL,
  not_after_ms BIGINT NOT NULL,
  revoked_at_ms BIGINT,
  revoke_reason TEXT
);
CREATE INDEX node_certs_node ON node_certs (node_id);

-- One-time join tokens: only the secret's hash and the token's public trust root are kept.
CREATE TABLE join_tokens (
  token_id TEXT PRIMARY KEY,
  secret_hash TEXT NOT NULL,
  node_id TEXT NOT NULL,
  role TEXT NOT NULL,
  root_cert_pem TEXT NOT NULL,
  created_at_ms BIGINT NOT NULL,
  expires_at_ms BIGINT NOT NULL,
  used_at_ms BIGINT
);

-- Gateways and singleton workers.
CREATE TABLE leases (
  name TEXT PRIMARY KEY,
  holder TEXT NOT NULL,
  expires_at_ms BIGINT NOT NULL
);

-- Node-journaled events, deduplicated by (node, journal, seq).
CREATE TABLE node_events (
  node_id TEXT NOT NULL,
  journal_id TEXT NOT NULL,
  seq BIGINT NOT NULL,
  type TEXT NOT NULL,
  body {{BLOB}},
  received_at_ms BIGINT NOT NULL,
  PRIMARY KEY (node_id, journal_id, seq)
);

-- Hold reservations and the atoms they book (reference: "Device assignments").
CREATE TABLE reservations (
  id TEXT PRIMARY KEY,
  node_id TEXT NOT NULL REFERENCES nodes(node_id),
  allocation_id TEXT NOT NULL UNIQUE,
  device_class TEXT NOT NULL,
  gpus INTEGER NOT NULL,
  binding TEXT NOT NULL DEFAULT 'hold',
  state TEXT NOT NULL,
  reason TEXT NOT NULL DEFAULT '',
  created_at_ms BIGINT NOT NULL,
  bound_at_ms BIGINT,
  released_at_ms BIGINT,
  generation BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX reservations_node ON reservations (node_id, state);

CREATE TABLE device_bookings (
  reservation_id TEXT NOT NULL REFERENCES reservations(id),
  node_id TEXT NOT NULL,
  device_class TEXT NOT NULL,
  atom_id TEXT NOT NULL,
  gpu_uuid TEXT NOT NULL,
  booked_at_ms BIGINT NOT NULL,
  released_at_ms BIGINT,
  PRIMARY KEY (reservation_id, atom_id)
);
CREATE UNIQUE INDEX device_bookings_live ON device_bookings (node_id, atom_id) WHERE released_at_ms IS NULL;

-- The append-only log of published events: Admin Watch, the TUI and the tests read it.
CREATE TABLE events (
  seq {{SERIAL_PK}},
  type TEXT NOT NULL,
  subject TEXT NOT NULL DEFAULT '',
  data TEXT NOT NULL DEFAULT '{}',
  at_ms BIGINT NOT NULL
);
CREATE INDEX events_type ON events (type, seq);

-- Server settings that must outlive a restart (the gateway id, the CA fingerprint).
CREATE TABLE settings (
  key TEXT PRIMARY KEY,
  value TEXT NOT NULL
);
