"""Many commands in one transaction (`bc.control.commands.runs.run_commands`, what RunCommand and
EnqueueCommands both call): every member stored, or, when one is refused, none, with a sentence naming it.

Runs on SQLite and on PostgreSQL (the unit `store` fixture).
"""

from __future__ import annotations

import json
import random
from collections.abc import Awaitable, Callable

import pytest

from bc.control.base.bus import Bus
from bc.control.commands.queue import DEFAULT_NOT_AFTER_S, reply_size
from bc.control.commands.runs import RunRequest, run_commands
from bc.control.reads import queries
from bc.control.signing.signer import NullSigner, Signature
from bc.errors import NotFound, UsageError
from bc.protocol import limits
from bc.protocol.limits import LIMITS, Limits
from bc.protocol.pb import kinds_pb2, session_pb2
from bc.store import Row, Store
from bc.store import nodes as nodes_sql

AddNode = Callable[..., Awaitable[None]]
Count = Callable[[str], Awaitable[int]]
Events = Callable[[str], Awaitable[list[Row]]]
Run = Callable[..., Awaitable[list[Row]]]


@pytest.fixture
def run(store: Store, bus: Bus, rng: random.Random) -> Run:
    async def go(*runs: RunRequest, operator: str = "alice") -> list[Row]:
        return await run_commands(store, bus, NullSigner(), list(runs), operator, rng)

    return go


async def seqs(store: Store, *node_ids: str) -> list[int]:
    async with store.transaction(write=False) as tx:
        rows = [await nodes_sql.get(tx, n) for n in node_ids]
    return [int(r["next_cmd_seq"]) for r in rows if r is not None]


async def nothing_stored(store: Store, count: Count, events: Events, pokes: list[str], *node_ids: str) -> None:
    assert await count("commands") == 0
    assert await events("command.") == []
    assert await seqs(store, *node_ids) == [1] * len(node_ids)
    assert pokes == []


async def test_every_member_is_enqueued_in_order_in_one_call(
    store: Store, add_node: AddNode, run: Run, events: Events, pokes: list[str]
) -> None:
    for n in ("n1", "n2", "n3"):
        await add_node(n)
    rows = await run(
        RunRequest("n1", "inventory.refresh"),
        RunRequest("n2", "gpu.reset", '{"gpu_uuids": ["GPU-2"]}', not_after_s=90),
        RunRequest("n3", "inventory.refresh", min_generation=4, idempotency_key="k3"),
        RunRequest("n1", "diag.nvml"),
    )
    assert [(r["node_id"], r["kind"], r["seq"], r["state"]) for r in rows] == [
        ("n1", "inventory.refresh", 1, "pending"),
        ("n2", "gpu.reset", 1, "pending"),
        ("n3", "inventory.refresh", 1, "pending"),
        ("n1", "diag.nvml", 2, "pending"),
    ]
    assert {r["requested_by"] for r in rows} == {"alice"}
    assert rows[2]["idempotency_key"] == "k3" and rows[2]["min_generation"] == 4
    assert rows[1]["not_after_ms"] - rows[1]["created_at_ms"] == 90_000
    assert rows[0]["not_after_ms"] - rows[0]["created_at_ms"] == DEFAULT_NOT_AFTER_S * 1000
    reset = kinds_pb2.GpuResetRequest()
    assert session_pb2.CommandBody.FromString(bytes(rows[1]["body"])).payload.Unpack(reset)
    assert list(reset.gpu_uuids) == ["GPU-2"]
    assert [e["subject"] for e in await events("command.enqueued")] == [r["id"] for r in rows]
    assert sorted(pokes) == ["n1", "n1", "n2", "n3"]


async def test_a_fan_out_shares_one_payload_text(store: Store, add_node: AddNode, run: Run) -> None:
    for i in range(20):
        await add_node(f"n{i}")
    payload = '{"level": 2}'
    rows = await run(*(RunRequest(f"n{i}", "diag.dcgm", payload) for i in range(20)))
    assert len({r["id"] for r in rows}) == 20
    for r in rows:
        req = kinds_pb2.DiagDcgmRequest()
        assert session_pb2.CommandBody.FromString(bytes(r["body"])).payload.Unpack(req) and req.level == 2


BIG_URL = '{"upload_url": "' + "x" * LIMITS.max_payload_bytes + '"}'

REFUSALS = [
    (RunRequest("ghost", "inventory.refresh"), NotFound, r"\(inventory.refresh on 'ghost'\): no node named 'ghost'$"),
    (RunRequest("n2", "disk.format"), UsageError, r"\(disk.format on 'n2'\): unknown command kind 'disk.format'"),
    (RunRequest("n2", "gpu.reset", '{"gpu_uuid": 1}'), UsageError, r"payload is not a valid GpuResetRequest"),
    (RunRequest("n2", "gpu.reset", "[1]"), UsageError, r"must be a JSON object, not list$"),
    (RunRequest("n2", "bmc.query"), UsageError, r"kind bmc.query does not run on node n2 \(role node\)"),
    (RunRequest("n2", "inventory.refresh", not_after_s=8 * 86400), UsageError, r"not_after must be between 1 s"),
    (RunRequest("n2", "inventory.refresh", not_after_s=-5), UsageError, r"not_after must be between"),
    (RunRequest("n2", "inventory.refresh", min_generation=-1), UsageError, r"min_generation must not be negative"),
    (RunRequest("n2", "logs.collect", BIG_URL), UsageError, r"\(max_payload_bytes\)$"),
]
"""A bad second member of three, its error and the end of the sentence (which starts `command 2 of 3 (`)."""


@pytest.mark.parametrize(("bad", "error", "match"), REFUSALS)
async def test_one_refused_member_refuses_the_call_and_stores_nothing(
    store: Store,
    add_node: AddNode,
    run: Run,
    count: Count,
    events: Events,
    pokes: list[str],
    bad: RunRequest,
    error: type[Exception],
    match: str,
) -> None:
    for n in ("n1", "n2", "n3"):
        await add_node(n)
    with pytest.raises(error, match=match) as e:
        await run(RunRequest("n1", "inventory.refresh"), bad, RunRequest("n3", "inventory.refresh"))
    assert str(e.value).startswith(f"command 2 of 3 ({bad.kind} on {bad.node_id!r}): ")
    assert "\n" not in str(e.value)
    await nothing_stored(store, count, events, pokes, "n1", "n2", "n3")


async def test_a_refusal_after_earlier_inserts_rolls_them_back(
    store: Store, bus: Bus, add_node: AddNode, count: Count, events: Events, pokes: list[str], rng: random.Random
) -> None:
    """The last member fails inside the transaction, after the others took seqs and wrote rows and events."""
    for n in ("n1", "n2"):
        await add_node(n)

    class SignerThatBreaksOnTheFifth(NullSigner):
        signed = 0

        def sign_command(self, body: bytes) -> Signature:
            self.signed += 1
            if self.signed == 5:
                raise RuntimeError("the signing key is unavailable")
            return super().sign_command(body)

    runs = [RunRequest(f"n{1 + i % 2}", "inventory.refresh") for i in range(5)]
    with pytest.raises(RuntimeError, match="signing key"):
        await run_commands(store, bus, SignerThatBreaksOnTheFifth(), runs, "alice", rng)
    await nothing_stored(store, count, events, pokes, "n1", "n2")


async def test_a_lone_members_refusal_is_runcommands_own_sentence(add_node: AddNode, run: Run) -> None:
    with pytest.raises(NotFound, match=r"^no node named 'ghost'$"):
        await run(RunRequest("ghost", "inventory.refresh"))


async def test_no_members_and_too_many_are_refused_before_anything_is_read(
    store: Store, add_node: AddNode, run: Run, count: Count, events: Events, pokes: list[str]
) -> None:
    await add_node("n1")
    with pytest.raises(UsageError, match="no commands to enqueue"):
        await run()
    over = LIMITS.max_enqueue_cmds + 1
    with pytest.raises(UsageError, match=r"^the command list has 10,001; the limit is 10,000 \(max_enqueue_cmds\)$"):
        await run(*[RunRequest("n1", "inventory.refresh")] * over)
    await nothing_stored(store, count, events, pokes, "n1")


async def test_a_repeated_key_returns_the_first_command_within_the_call_and_after_it(
    store: Store, add_node: AddNode, run: Run, count: Count
) -> None:
    await add_node("n1")
    await add_node("n2")
    first = await run(RunRequest("n1", "inventory.refresh", idempotency_key="sweep-7"))
    rows = await run(
        RunRequest("n1", "inventory.refresh", idempotency_key="sweep-7"),
        RunRequest("n2", "inventory.refresh", idempotency_key="sweep-7"),
        RunRequest("n2", "inventory.refresh", idempotency_key="sweep-7"),
    )
    assert rows[0] == first[0]
    assert rows[1]["id"] == rows[2]["id"] != rows[0]["id"]
    assert await count("commands") == 2
    assert await seqs(store, "n1", "n2") == [2, 2]


async def test_many_commands_for_one_node_take_consecutive_seqs_and_the_next_call_goes_on_after_them(
    store: Store, add_node: AddNode, run: Run
) -> None:
    """One call reads each node once and raises its next seq once (`NodesTaken`): what the node sees is
    still one seq after another, in the call's order, and the next enqueue takes the one after."""
    for n in ("n1", "n2"):
        await add_node(n)
    rows = await run(*(RunRequest("n1" if i % 3 else "n2", "inventory.refresh") for i in range(9)))
    assert [(r["node_id"], r["seq"]) for r in rows] == [
        ("n2", 1), ("n1", 1), ("n1", 2), ("n2", 2), ("n1", 3), ("n1", 4), ("n2", 3), ("n1", 5), ("n1", 6),
    ]  # fmt: skip
    assert await seqs(store, "n1", "n2") == [7, 4]
    [single] = await run(RunRequest("n1", "diag.nvml"))
    again = await run(RunRequest("n2", "diag.nvml"), RunRequest("n2", "diag.nvml"))
    assert (single["seq"], [r["seq"] for r in again]) == (7, [4, 5])
    assert await seqs(store, "n1", "n2") == [8, 6]
    listed = await queries.commands(store, node_id="n1")  # what `bc cmd list --node n1` shows
    assert sorted(c.seq for c in listed.commands) == list(range(1, 8))


async def test_a_call_whose_reply_could_not_fit_a_frame_is_refused_and_stores_nothing(
    store: Store,
    add_node: AddNode,
    run: Run,
    count: Count,
    events: Events,
    pokes: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Checked on the rows inside the transaction (a repeated key's row may carry a long message), so a
    refusal rolls every member back. A frame of 2,000 bytes here, so that the keys stay short."""
    monkeypatch.setattr(limits, "LIMITS", Limits(max_frame_bytes=2_000))
    await add_node("n1")
    await add_node("n2")
    key = "k" * 600  # each member fits; the reply echoing three keys does not
    runs = [RunRequest(n, "inventory.refresh", idempotency_key=key + str(i)) for i, n in enumerate(("n1", "n2", "n1"))]
    with pytest.raises(
        UsageError, match=r"the reply to these 3 commands would be about [\d,]+ bytes; the limit is 2,000"
    ):
        await run(*runs)
    await nothing_stored(store, count, events, pokes, "n1", "n2")


async def test_the_enqueued_events_carry_each_member(add_node: AddNode, run: Run, events: Events) -> None:
    await add_node("n1")
    await add_node("n2")
    rows = await run(RunRequest("n1", "inventory.refresh"), RunRequest("n2", "inventory.refresh"))
    data = [json.loads(e["data"]) for e in await events("command.enqueued")]
    assert [(d["node_id"], d["seq"], d["idempotency_key"]) for d in data] == [
        ("n1", 1, rows[0]["idempotency_key"]),
        ("n2", 1, rows[1]["idempotency_key"]),
    ]


async def test_the_reply_estimate_is_never_below_the_encoded_reply(
    store: Store, add_node: AddNode, run: Run, bus: Bus, rng: random.Random
) -> None:
    """`check_reply_size` refuses on an estimate; it must not under-count what `queries.enqueued` sends."""
    await add_node("n" * 128)
    await add_node("n2")
    rows = await run(
        RunRequest("n" * 128, "diag.nvml", idempotency_key="k" * 300, min_generation=2**40),
        *(RunRequest("n2", "inventory.refresh") for _ in range(20)),
        operator="o" * 128,
    )
    reply = await queries.enqueued(store, rows)
    assert [c.id for c in reply.commands] == [r["id"] for r in rows]
    assert reply_size(rows) >= reply.ByteSize()
