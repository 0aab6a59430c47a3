-- Capacity (issue 13, docs/capacity.md): reservations become bookings of time with a pending queue.
-- A reservation gains its submit order, its window (start, end or duration; NULL: as soon as possible,
-- open-ended), a tenant, a label selector, host resources with the NUMA nodes they were pinned to, the
-- node it asked for (`want_node_id`, --node) apart from the node it is booked on (`node_id`, NULL while
-- pending unbooked), when it was placed (usage starts at the later of that and its window's start) and
-- the states `pending` and `ended`. A booking gains its interval [start_ms, end_ms) (end NULL: open).
-- A CHECK cannot be altered and NOT NULL not dropped in SQLite, so both tables are rebuilt, children
-- first, keeping every row. The live-booking unique index goes: two windows may share an atom when they
-- are disjoint, so I1 is an interval check in the booking transaction (bc.control.placement_pass).
CREATE TABLE device_bookings_copy AS SELECT * FROM device_bookings;
DROP TABLE device_bookings;
CREATE TABLE reservations_copy AS SELECT * FROM reservations;
DROP TABLE reservations;
CREATE TABLE reservations (
  id TEXT PRIMARY KEY,
  seq BIGINT NOT NULL UNIQUE,
  node_id TEXT REFERENCES nodes(node_id),
  want_node_id TEXT,
  allocation_id TEXT NOT NULL UNIQUE,
  device_class TEXT NOT NULL,
  gpus INTEGER NOT NULL,
  binding TEXT NOT NULL DEFAULT 'hold',
  state TEXT NOT NULL CHECK (state IN ('pending', 'placed', 'active', 'releasing', 'released', 'failed', 'lost', 'ended')),
  reason TEXT NOT NULL DEFAULT '',
  created_at_ms BIGINT NOT NULL,
  bound_at_ms BIGINT,
  released_at_ms BIGINT,
  generation BIGINT NOT NULL DEFAULT 0,
  start_ms BIGINT,
  end_ms BIGINT,
  duration_ms BIGINT,
  tenant TEXT NOT NULL DEFAULT '',
  selector TEXT NOT NULL DEFAULT '{}',
  cpus INTEGER NOT NULL DEFAULT 0 CHECK (cpus >= 0),
  memory_bytes BIGINT NOT NULL DEFAULT 0 CHECK (memory_bytes >= 0),
  hugepages_1g INTEGER NOT NULL DEFAULT 0 CHECK (hugepages_1g >= 0),
  cpu_numa TEXT NOT NULL DEFAULT '[]',
  mem_numa TEXT NOT NULL DEFAULT '[]',
  placed_at_ms BIGINT,
  ended_at_ms BIGINT,
  CHECK (node_id IS NOT NULL OR state IN ('pending', 'failed', 'released', 'ended'))
);
INSERT INTO reservations (id, seq, node_id, want_node_id, allocation_id, device_class, gpus, binding, state, reason,
                          created_at_ms, bound_at_ms, released_at_ms, generation, start_ms, placed_at_ms, ended_at_ms)
  SELECT c.id,
         (SELECT COUNT(*) FROM reservations_copy o
           WHERE o.created_at_ms < c.created_at_ms OR (o.created_at_ms = c.created_at_ms AND o.id <= c.id)),
         c.node_id, c.node_id, c.allocation_id, c.device_class, c.gpus, c.binding, c.state, c.reason,
         c.created_at_ms, c.bound_at_ms, c.released_at_ms, c.generation, c.created_at_ms, c.created_at_ms,
         c.released_at_ms
    FROM reservations_copy c;
DROP TABLE reservations_copy;
CREATE INDEX reservations_node ON reservations (node_id, state);
CREATE INDEX reservations_state ON reservations (state, seq);
CREATE INDEX reservations_tenant ON reservations (tenant, seq);
CREATE TABLE device_bookings (
  reservation_id TEXT NOT NULL REFERENCES reservations(id),
  node_id TEXT NOT NULL,
  device_class TEXT NOT NULL,
  atom_id TEXT NOT NULL,
  gpu_uuid TEXT NOT NULL,
  booked_at_ms BIGINT NOT NULL,
  released_at_ms BIGINT,
  start_ms BIGINT NOT NULL,
  end_ms BIGINT,
  PRIMARY KEY (reservation_id, atom_id),
  CHECK (end_ms IS NULL OR end_ms > start_ms)
);
INSERT INTO device_bookings (reservation_id, node_id, device_class, atom_id, gpu_uuid, booked_at_ms, released_at_ms,
                             start_ms, end_ms)
  SELECT reservation_id, node_id, device_class, atom_id, gpu_uuid, booked_at_ms, released_at_ms, booked_at_ms,
         CASE WHEN released_at_ms IS NOT NULL AND released_at_ms > booked_at_ms THEN released_at_ms
              WHEN released_at_ms IS NOT NULL THEN booked_at_ms + 1 ELSE NULL END
    FROM device_bookings_copy;
DROP TABLE device_bookings_copy;
CREATE INDEX device_bookings_node ON device_bookings (node_id, released_at_ms);

-- Usage, written as closed windows while a hold is active (bc.control.usage_windows): keyed so that a
-- retried flush inserts nothing twice (ON CONFLICT DO NOTHING).
CREATE TABLE usage_windows (
  reservation_id TEXT NOT NULL REFERENCES reservations(id),
  start_ms BIGINT NOT NULL,
  end_ms BIGINT NOT NULL,
  node_id TEXT NOT NULL,
  tenant TEXT NOT NULL DEFAULT '',
  device_class TEXT NOT NULL,
  atoms INTEGER NOT NULL,
  PRIMARY KEY (reservation_id, start_ms),
  CHECK (end_ms > start_ms)
);
CREATE INDEX usage_windows_start ON usage_windows (start_ms);

-- Locked by every placement pass: it serializes passes across processes (PostgreSQL takes the row lock;
-- SQLite's single writer does the rest), so two passes never book from the same look at the bookings.
CREATE TABLE placement_meta (
  id INTEGER PRIMARY KEY CHECK (id = 1),
  version BIGINT NOT NULL
);
INSERT INTO placement_meta (id, version) VALUES (1, 0);
