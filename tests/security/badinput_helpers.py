"""Helpers shared by the bad-input security tests (issue 29): a real inline-SQLite store on the virtual
clock with one connected node of fake GPUs, a pending row written straight into the store (as an older
server or a script could have), and the refusal checks every CLI case makes."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from agent.hw.fake import FakeHardware
from bc.control.base.bus import Bus
from bc.control.signing.signer import NullSigner
from bc.seams.clock import LoopClock
from bc.store import Row
from bc.store import capacity as cap_sql
from bc.store import events as events_sql
from bc.store import nodes as nodes_sql
from bc.store.sqlite import InlineSqliteStore
from tests.unit.control.conftest import write_inventory

SIGNER = NullSigner()


@asynccontextmanager
async def fleet_store(path: Path, clock: LoopClock) -> AsyncIterator[tuple[InlineSqliteStore, Bus]]:
    """A migrated store with node n1 (8 fake H100s) connected."""
    store = InlineSqliteStore(path, clock)
    await store.open()
    try:
        async with store.transaction() as tx:
            await nodes_sql.ensure(tx, "n1", "node", 0)
            await nodes_sql.set_connectivity(tx, "n1", "connected", 0)
        inv = FakeHardware("hgx-h100-8", "n1").inventory()
        del inv.numa_nodes[:]
        await write_inventory(store, "n1", inv)
        yield store, Bus()
    finally:
        await store.close()


async def store_pending_row(store: InlineSqliteStore, rid: str, **values: Any) -> None:
    """A pending reservation row as a script or an older server could have written it: no checks."""
    now_ms = await store.now_ms()
    row: dict[str, Any] = {
        "id_": rid,
        "allocation_id": "alloc-" + rid,
        "want_node_id": None,
        "device_class": "gpu",
        "gpus": 1,
        "binding": "hold",
        "start_ms": None,
        "end_ms": None,
        "duration_ms": None,
        "tenant": "",
        "selector_json": "{}",
        "cpus": 0,
        "memory_bytes": 0,
        "hugepages_1g": 0,
        "now_ms": now_ms,
    }
    row.update(values)
    async with store.transaction() as tx:
        await cap_sql.insert_pending(tx, **row)


async def reservation_row(store: InlineSqliteStore, rid: str) -> Row:
    async with store.transaction(write=False) as tx:
        row = await tx.fetchone("SELECT * FROM reservations WHERE id = :i", {"i": rid})
    assert row is not None, rid
    return row


async def events_of(store: InlineSqliteStore, type_: str) -> list[tuple[str, dict[str, Any]]]:
    async with store.transaction(write=False) as tx:
        rows = await events_sql.list_events(tx, 0, 10_000, type_)
    return [(str(r["subject"]), json.loads(str(r["data"]))) for r in rows if str(r["type"]) == type_]


def rng() -> random.Random:
    return random.Random(29)


def memory_capped(argv: list[str], gib: int = 2) -> list[str]:
    """`argv` run with the child's address space capped: a CLI that reads a file without bound dies of
    MemoryError quickly instead of taking the shared machine's memory.

    The cap is set by a tiny Python that then execs `argv`, not by a `preexec_fn`: pytest-xdist's worker is
    threaded, and a `preexec_fn` runs between fork and exec where another thread may hold a lock the child
    needs (it aborted now and then)."""
    cap = gib << 30
    code = (
        "import os, resource, sys; "
        f"resource.setrlimit(resource.RLIMIT_AS, ({cap}, {cap})); "
        "os.execv(sys.argv[1], sys.argv[1:])"
    )
    return [sys.executable, "-c", code, *argv]


def one_sentence_problems(r: subprocess.CompletedProcess[str], exit_code: int, *mentions: str) -> list[str]:
    """What is wrong with how `bc` refused: the exit code, one `error:` line, no traceback, the words."""
    problems = []
    if r.returncode != exit_code:
        problems.append(f"exit {r.returncode}, not {exit_code}")
    lines = r.stderr.splitlines()
    if len(lines) != 1 or not lines[0].startswith("error:"):
        problems.append(f"stderr is not one 'error:' line: {r.stderr[-600:]!r}")
    if "Traceback" in r.stderr:
        problems.append("a traceback")
    problems += [f"does not mention {m!r}: {r.stderr[-400:]!r}" for m in mentions if m not in r.stderr]
    return problems
