"""Shell typescripts: the `--record` policy, the chunks a `bc shell --record` uploads, reading one back
(docs/access.md, "Typescripts").

The payload of a tunnel is TLS (and SSH inside it) between the operator's `bc` and the node: no control-plane
process sees a shell's bytes. Only the operator's own client does, when it runs ssh on a pty it owns; it
promises a typescript in the ticket (`rec`) and uploads what the pty wrote here, bound to the tunnel's sid.
This records what an honest client saw: a modified client can send anything, or nothing (the record then says
`missing`). Node-side recording is the enforceable design, not built.
"""

from __future__ import annotations

from bc.control.base import actor
from bc.control.base.bus import Bus
from bc.control.base.events import publish
from bc.errors import Conflict, NotFound, Unauthenticated, UsageError
from bc.store import Row, Store, Tx
from bc.store import settings as settings_sql
from bc.store import tunnels as tunnels_sql

POLICY_KEY = "tunnels.record_policy"
POLICIES = ("off", "optional", "required")
MAX_CHUNK = 64 * 1024
"""The most bytes one `UploadTypescript` call carries."""
MAX_TYPESCRIPT = 8 * 1024 * 1024
"""The most bytes of one session's typescript the control plane keeps."""
GRACE_MS = 60_000
"""How long after its session ended a typescript may still arrive (the client flushes after ssh exits)."""


async def policy(tx: Tx) -> str:
    return await settings_sql.get(tx, POLICY_KEY) or "off"


async def get_policy(store: Store) -> str:
    async with store.transaction(write=False) as tx:
        return await policy(tx)


async def set_policy(store: Store, bus: Bus, value: str) -> str:
    if value not in POLICIES:
        raise UsageError(f"the record policy {value[:32]!r} is not one of {', '.join(POLICIES)}")
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        before = await policy(tx)
        if before != value:
            await settings_sql.put(tx, POLICY_KEY, value)
            data = {"policy": value, "was": before, "by": actor.current()}
            await publish(tx, bus, "tunnel.record-policy", "tunnels", data, now_ms)
    return value


def check_promise(current: str, purpose: str, record: bool) -> None:
    """Whether a ticket for `purpose` may be issued with (or without) the promise under the policy `current`."""
    if record and purpose != "shell":
        raise UsageError("only a shell is recorded: --record applies to `bc shell`")
    if record and current == "off":
        raise Conflict("typescripts are off on this control plane (an admin sets `bc tunnels record-policy`)")
    if purpose == "shell" and not record and current == "required":
        raise Conflict(
            "the record policy is `required`: a shell ticket is issued only with the promise of a typescript"
            " (run `bc shell --record`, which a current `bc` does by itself)"
        )


def state(row: Row, now_ms: int) -> str:
    """What the record says of the typescript: '' (none promised), pending, complete, partial or missing."""
    if not int(row.get("record_promised") or 0):
        return ""
    if int(row.get("typescript_done") or 0):
        return "complete"
    ended = row.get("ended_at_ms")
    open_or_in_grace = row["state"] in ("issued", "open") or (ended is not None and now_ms < int(ended) + GRACE_MS)
    if open_or_in_grace:
        return "pending"
    return "partial" if int(row.get("typescript_bytes") or 0) else "missing"


async def upload(store: Store, sid: str, offset: int, data: bytes, done: bool, operator: str) -> int:
    """Append one chunk of `sid`'s typescript for its own operator; the bytes held after it."""
    if len(data) > MAX_CHUNK:
        raise UsageError(f"a typescript chunk is at most {MAX_CHUNK} bytes, not {len(data)}")
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        row = await tunnels_sql.get_session(tx, sid)
        if row is None:
            raise NotFound(f"no tunnel {sid[:64]!r}")
        if str(row["operator"]) != operator:
            raise Unauthenticated(f"tunnel {sid} was opened by {row['operator']}, not by {operator}")
        if not int(row["record_promised"]):
            raise Conflict(f"tunnel {sid}'s ticket promised no typescript")
        if int(row["typescript_done"]):
            raise Conflict(f"tunnel {sid}'s typescript is complete already")
        ended = row["ended_at_ms"]
        if row["state"] in ("refused", "expired") or (ended is not None and now_ms >= int(ended) + GRACE_MS):
            raise Conflict(f"tunnel {sid} ended over {GRACE_MS // 1000} s ago: its typescript is closed")
        held = int(row["typescript_bytes"])
        if held + len(data) > MAX_TYPESCRIPT:
            raise Conflict(f"a typescript is at most {MAX_TYPESCRIPT // (1024 * 1024)} MiB; {sid} holds {held} bytes")
        if offset != held or not await tunnels_sql.append_typescript(tx, sid, offset, data, done):
            raise Conflict(f"tunnel {sid}'s typescript holds {held} bytes; a chunk at {offset} is out of order")
    return held + len(data)


async def read(store: Store, sid: str) -> list[bytes]:
    async with store.transaction(write=False) as tx:
        row = await tunnels_sql.get_session(tx, sid)
        if row is None:
            raise NotFound(f"no tunnel {sid[:64]!r}")
        if not int(row["record_promised"]):
            raise NotFound(f"tunnel {sid} has no typescript: its ticket promised none")
        return await tunnels_sql.typescript_chunks(tx, sid)
