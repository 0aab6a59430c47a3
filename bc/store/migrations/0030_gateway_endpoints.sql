-- Where each gateway process answers other control-plane processes (docs/access.md, "Gateways"): an api process
-- whose own gateway does not hold a node's session relays a tunnel to the gateway that does. A TTL lease like
-- api_endpoints: a gateway renews its row every few seconds; a row past its expiry is a gateway gone.
CREATE TABLE gateway_endpoints (
  gateway_id TEXT PRIMARY KEY,
  address TEXT NOT NULL,
  expires_at_ms BIGINT NOT NULL
);

-- An admin's close of a tunnel another api process relays: asked here, seen by the relaying process (it polls
-- the open tunnels it relays, and wakes on the events' NOTIFY), which ends the relay and writes the record.
ALTER TABLE tunnel_sessions ADD COLUMN close_asked TEXT NOT NULL DEFAULT '';
