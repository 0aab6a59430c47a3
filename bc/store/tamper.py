"""What an attacker with write access to an SQLite store file, and no worker key, could do (`make demo`).

The demo shows a node refusing a command whose body is the attacker's own and whose signature is
copied from a genuine one. Written with sqlite3 against the file, as the attacker would, so it
lives here with the rest of the SQL rather than in the demo.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

MakeBody = Callable[[int], bytes]
"""The forged body for the command sequence number the store hands out."""


def forge_command(
    db_path: Path, node_id: str, cid: str, kind: str, lane: str, not_after_ms: int, now_ms: int, make_body: MakeBody
) -> None:
    """Queue `cid` for `node_id` with a body of the forger's making and a genuine command's signature."""
    db = sqlite3.connect(db_path, timeout=10, isolation_level=None)
    try:
        db.execute("BEGIN IMMEDIATE")
        sig, key_id = db.execute(
            "SELECT signature, signer_key_id FROM commands WHERE node_id = ? AND signature IS NOT NULL LIMIT 1",
            (node_id,),
        ).fetchone()
        (seq,) = db.execute(
            "UPDATE nodes SET next_cmd_seq = next_cmd_seq + 1 WHERE node_id = ? RETURNING next_cmd_seq - 1",
            (node_id,),
        ).fetchone()
        db.execute(
            "INSERT INTO commands (id, node_id, seq, kind, lane, body, signature, signer_key_id, state,"
            " not_after_ms, idempotency_key, attested, created_at_ms, updated_at_ms)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?, 1, ?, ?)",
            (cid, node_id, seq, kind, lane, make_body(seq), sig, key_id, not_after_ms, f"forged:{cid}", now_ms, now_ms),
        )
        db.execute("COMMIT")
    finally:
        db.close()
