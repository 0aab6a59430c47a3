"""Enqueue: one transaction, the body encoded once, seq per node, idempotency, and refusals that store nothing."""

from __future__ import annotations

import base64
import json
import random
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from google.protobuf import any_pb2, struct_pb2

from bc.control.base.bus import Bus
from bc.control.commands.queue import EnqueueRequest, enqueue, payload_from_json
from bc.control.signing.signer import KeySigner, NullSigner, Signature
from bc.errors import NotFound, UsageError
from bc.pki.secrets_source import SystemSecrets
from bc.pki.signing import BadSignature, SigningKeys, Verifier
from bc.protocol.pb import common_pb2, kinds_pb2, session_pb2, site_kinds_pb2
from bc.seams.clock import LoopClock
from bc.seams.ids import ulid
from bc.store import Row
from bc.store import nodes as nodes_sql
from bc.store.sqlite import InlineSqliteStore, SqliteStore
from bc.testing import advance

AddNode = Callable[..., Awaitable[None]]
Enqueue = Callable[..., Awaitable[Row]]
Count = Callable[[str], Awaitable[int]]
Events = Callable[[str], Awaitable[list[Row]]]


async def next_cmd_seq(store: InlineSqliteStore, node_id: str = "n1") -> int:
    async with store.transaction(write=False) as tx:
        row = await nodes_sql.get(tx, node_id)
    assert row is not None
    return int(row["next_cmd_seq"])


async def test_enqueue_stores_a_pending_command_with_its_body_encoded_once(
    store: InlineSqliteStore,
    bus: Bus,
    pokes: list[str],
    clock: LoopClock,
    add_node: AddNode,
    events: Events,
) -> None:
    await add_node("n1")
    payload = payload_from_json("gpu.reset", '{"gpu_uuids": ["GPU-1"]}')
    row = await enqueue(
        store,
        bus,
        NullSigner(),
        EnqueueRequest(node_id="n1", kind="gpu.reset", payload=payload, not_after_s=60, min_generation=3),
        random.Random(1),
    )
    now_ms = round(clock.now() * 1000)
    assert row["state"] == "pending" and row["seq"] == 1 and row["lane"] == "control"
    assert row["not_after_ms"] == now_ms + 60_000 and row["min_generation"] == 3
    assert (row["retry_safe"], row["self_terminating"], row["attested"]) == (0, 0, 1)
    assert row["idempotency_key"] == f"cmd:{row['id']}"
    assert row["signature"] is None and row["attempt"] == 0
    # The id is a ULID of the store's clock.
    assert row["id"][:10] == ulid(clock.now(), random.Random(0))[:10]

    body = session_pb2.CommandBody.FromString(bytes(row["body"]))
    assert (body.id, body.node_id, body.seq, body.kind) == (row["id"], "n1", 1, "gpu.reset")
    assert body.lane == session_pb2.CONTROL and body.not_after_ms == now_ms + 60_000
    assert body.attested and not body.retry_safe and body.idempotency_key == row["idempotency_key"]
    req = kinds_pb2.GpuResetRequest()
    assert body.payload.Unpack(req) and list(req.gpu_uuids) == ["GPU-1"]
    assert body.SerializeToString(deterministic=True) == bytes(row["body"])

    [ev] = await events("command.enqueued")
    assert ev["subject"] == row["id"]
    assert json.loads(ev["data"]) == {
        "node_id": "n1",
        "kind": "gpu.reset",
        "seq": 1,
        "idempotency_key": row["idempotency_key"],
    }
    assert pokes == ["n1"]


async def test_seq_is_per_node_and_comes_from_next_cmd_seq(
    store: InlineSqliteStore, add_node: AddNode, put: Enqueue
) -> None:
    await add_node("n1")
    await add_node("n2")
    seqs = [(await put("n1"))["seq"], (await put("n2"))["seq"], (await put("n1"))["seq"], (await put("n1"))["seq"]]
    assert seqs == [1, 1, 2, 3]
    assert await next_cmd_seq(store, "n1") == 4
    assert await next_cmd_seq(store, "n2") == 2


async def test_a_repeated_idempotency_key_returns_the_first_command_unchanged(
    store: InlineSqliteStore, add_node: AddNode, put: Enqueue, count: Count, events: Events, clock: LoopClock
) -> None:
    await add_node("n1")
    await add_node("n2")
    first = await put("n1", idempotency_key="wf:dag:1", not_after_s=30)
    await advance(5)
    again = await put("n1", kind="diag.nvml", idempotency_key="wf:dag:1", not_after_s=900)
    assert again == first
    assert await count("commands") == 1
    assert len(await events("command.enqueued")) == 1
    assert await next_cmd_seq(store, "n1") == 2  # the repeat took no seq
    # The key is unique per node, not globally.
    other = await put("n2", idempotency_key="wf:dag:1")
    assert other["id"] != first["id"]


async def test_empty_keys_get_fresh_ones(add_node: AddNode, put: Enqueue) -> None:
    await add_node("n1")
    a, b = await put("n1"), await put("n1")
    assert a["idempotency_key"] == f"cmd:{a['id']}" and b["idempotency_key"] == f"cmd:{b['id']}"
    assert a["id"] != b["id"]


async def test_the_worker_key_signs_the_stored_body_bytes(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode, tmp_path: Path, clock: LoopClock, rng: random.Random
) -> None:
    await add_node("n1")
    keys = SigningKeys.create(tmp_path, clock, random.Random(1), SystemSecrets())
    row = await enqueue(store, bus, KeySigner(keys), EnqueueRequest("n1", "inventory.refresh", any_pb2.Any()), rng)
    assert str(row["signer_key_id"]) == keys.worker.key_id
    env = common_pb2.Envelope(
        purpose="command",
        body=bytes(row["body"]),
        signature=bytes(row["signature"]),
        key_id=keys.worker.key_id,
        cert_chain=[keys.worker.cert_der],
    )
    assert Verifier([keys.root_pem]).verify(env, "command", clock.now()) == keys.worker.key_id
    env.body = env.body + b"\x00"
    with pytest.raises(BadSignature, match="does not match the body"):
        Verifier([keys.root_pem]).verify(env, "command", clock.now())


async def test_with_signing_off_the_row_is_in_the_documented_unsigned_form(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode, rng: random.Random
) -> None:
    await add_node("n1")
    row = await enqueue(store, bus, NullSigner(), EnqueueRequest("n1", "inventory.refresh", any_pb2.Any()), rng)
    assert row["signature"] is None and row["signer_key_id"] == ""


@pytest.mark.parametrize(
    ("kw", "error", "match"),
    [
        (
            {"kind": "disk.format"},
            UsageError,
            r"unknown command kind 'disk.format'; known kinds: bmc.boot, .*gpu",
        ),
        ({"kind": "bmc.query"}, UsageError, r"bmc.query does not run on node n1 \(role node\); it runs on site"),
        ({"not_after_s": 0}, UsageError, "not_after must be between 1 s and 7 days"),
        ({"not_after_s": 0.5}, UsageError, "not_after must be between 1 s and 7 days"),
        ({"not_after_s": 8 * 86400}, UsageError, "not_after must be between 1 s and 7 days"),
        ({"not_after_s": 60, "not_before_s": 60}, UsageError, "not_before"),
        ({"min_generation": -1}, UsageError, "min_generation"),
        ({"node_id": "ghost"}, NotFound, "no node named 'ghost'"),
        (
            {"kind": "gpu.reset", "payload": payload_from_json("diag.nvml", "{}")},
            UsageError,
            "must be a bc.v1.GpuResetRequest, not bc.v1.DiagNvmlRequest",
        ),
    ],
)
async def test_refused_requests_store_nothing(
    store: InlineSqliteStore,
    pokes: list[str],
    add_node: AddNode,
    put: Enqueue,
    count: Count,
    events: Events,
    kw: dict[str, object],
    error: type[Exception],
    match: str,
) -> None:
    await add_node("n1")
    with pytest.raises(error, match=match):
        await put(**{"node_id": "n1", **kw})
    assert await count("commands") == 0
    assert await events("command.") == []
    assert await next_cmd_seq(store, "n1") == 1
    assert pokes == []


async def test_a_site_kind_runs_on_a_site(add_node: AddNode, put: Enqueue) -> None:
    await add_node("s1", role="site")
    row = await put("s1", kind="bmc.query", payload=payload_from_json("bmc.query", '{"machine": "m1"}'))
    body = session_pb2.CommandBody.FromString(bytes(row["body"]))
    doc = site_kinds_pb2.BmcQueryRequest()
    assert body.payload.Unpack(doc) and doc.machine == "m1"
    # A site kind names a machine of the site's section: a BMC's address never travels in a command.
    with pytest.raises(UsageError, match='no field named "host"'):
        payload_from_json("bmc.query", '{"host": "10.0.0.9"}')


# -- payload_from_json --------------------------------------------------------------------


def test_payload_from_json_packs_the_kinds_request() -> None:
    any_ = payload_from_json("logs.collect", '{"upload_url": "https://x/y", "max_bytes": 1024}')
    msg = kinds_pb2.LogsCollectRequest()
    assert any_.Unpack(msg) and (msg.upload_url, msg.max_bytes) == ("https://x/y", 1024)
    assert payload_from_json("inventory.refresh", "").Is(kinds_pb2.InventoryRefreshRequest.DESCRIPTOR)
    assert payload_from_json("driver.invoke", '{"a": [1, 2]}').Is(struct_pb2.Struct.DESCRIPTOR)


@pytest.mark.parametrize(
    ("kind", "text", "match"),
    [
        ("gpu.reset", '{"gpu_uuid": ["x"]}', 'not a valid GpuResetRequest: .*has no field named "gpu_uuid"'),
        ("gpu.reset", "{bad", "not valid JSON"),
        ("gpu.reset", "[1]", "must be a JSON object, not list"),
        ("diag.dcgm", '{"level": "high"}', "not a valid DiagDcgmRequest"),
        ("bmc.query", '"x"', "must be a JSON object, not str"),
    ],
)
def test_bad_payloads_are_one_line_usage_errors(kind: str, text: str, match: str) -> None:
    with pytest.raises(UsageError, match=match) as e:
        payload_from_json(kind, text)
    assert "\n" not in e.value.message


async def test_enqueue_is_one_transaction(
    store: InlineSqliteStore,
    bus: Bus,
    pokes: list[str],
    add_node: AddNode,
    count: Count,
    events: Events,
    rng: random.Random,
) -> None:
    """A failure after the seq was taken (here: the signer) leaves no trace: no seq, no row, no event, no poke."""
    await add_node("n1")

    class BrokenSigner(NullSigner):
        def sign_command(self, body: bytes) -> Signature:
            raise RuntimeError("the signing key is unavailable")

    with pytest.raises(RuntimeError, match="signing key"):
        await enqueue(store, bus, BrokenSigner(), EnqueueRequest("n1", "inventory.refresh", any_pb2.Any()), rng)
    assert await next_cmd_seq(store, "n1") == 1
    assert await count("commands") == 0
    assert await events("command.") == []
    assert pokes == []


async def test_the_aiosqlite_driver_takes_seqs_the_same_way(
    tmp_path: Path, clock: LoopClock, rng: random.Random
) -> None:
    """`bc serve` runs on aiosqlite: UPDATE … RETURNING and the idempotency conflict behave there too."""
    store = SqliteStore(tmp_path / "aio.db", clock)
    await store.open()
    try:
        async with store.transaction() as tx:
            await nodes_sql.ensure(tx, "n1", "node", await store.now_ms())
        req = EnqueueRequest("n1", "inventory.refresh", any_pb2.Any(), idempotency_key="k")
        unsigned = NullSigner()
        a = await enqueue(store, None, unsigned, EnqueueRequest("n1", "inventory.refresh", any_pb2.Any()), rng)
        b = await enqueue(store, None, unsigned, req, rng)
        assert (a["seq"], b["seq"]) == (1, 2)
        assert await enqueue(store, None, unsigned, req, rng) == b
    finally:
        await store.close()


@pytest.mark.parametrize("nested", ["[" * 5000 + "]" * 5000, '{"a":' * 5000 + "1" + "}" * 5000])
def test_a_payload_nested_past_the_parsers_depth_is_one_sentence(nested: str) -> None:
    # Found by the Admin fuzzer: a RecursionError reached the caller as an internal error.
    with pytest.raises(UsageError, match=r"nests too deeply"):
        payload_from_json("inventory.refresh", nested if nested.startswith("{") else '{"x":' + nested + "}")


def test_a_result_nested_past_the_parsers_depth_is_shown_as_bytes() -> None:
    from bc.control.reads.views import result_text

    raw = ("[" * 5000 + "]" * 5000).encode()
    assert result_text(raw) == base64.b64encode(raw).decode("ascii")
