-- The spec signer (bc/control/nodes/spec_signing.py) looks for generations a keyless gateway wrote unsigned
-- every 2 s and on each poke; without an index that read scanned every node's row: 9.4 ms at 10,000 nodes
-- on SQLite, for the nothing it nearly always finds. The partial index holds only the waiting ones (0.02 ms).
CREATE INDEX nodes_spec_sign_pending ON nodes (node_id) WHERE spec_sign_pending = 1;
