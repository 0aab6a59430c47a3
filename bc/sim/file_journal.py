"""The agent's real SQLite journal file, driven inline on the simulator's loop (`bc sim --journal-files`).

`agent.journal.Journal` talks to its file through aiosqlite, whose worker thread the virtual-time loop
cannot see: the loop would jump to the next timer while a statement runs, and a run would stop being a
function of its seed. `open_inline` opens the same `Journal` (its schema, its WAL and `synchronous=FULL`
fsyncs, its rules) over `agent.journal_conn.InlineConnection`, which runs each statement at once on the
loop's thread, and makes its file private inline too. Nothing suspends that the memory journal would not, so a run on
journal files interleaves its tasks exactly as one on memory journals and writes the same events log.
The statements are the journal's own; nothing here holds SQL.
"""

from __future__ import annotations

import random
from pathlib import Path

from agent.journal import Journal
from agent.journal_conn import connect_inline
from agent.offload import inline


async def open_inline(path: Path, node_id: str, rng: random.Random) -> Journal:
    """The node's journal file, opened (or created, with a journal id from `rng`) over an inline connection."""
    return await Journal.open(path, node_id, rng=rng, connect=connect_inline, offload=inline)
