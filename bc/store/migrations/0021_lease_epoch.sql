-- A lease's epoch: one more each time the lease passes to another holder (docs/fleet.md, "One process per
-- gateway id"). A process remembers the epoch it took the lease at; a later epoch means another process took
-- it in between, and the one holding the older epoch stops acting (bc.gateway.lease).
ALTER TABLE leases ADD COLUMN epoch BIGINT NOT NULL DEFAULT 0;
