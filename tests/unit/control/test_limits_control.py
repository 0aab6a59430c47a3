"""The control plane's size limits: refused before anything is stored, with the limit named.

One test per limit the Admin writes enforce (max_payload_bytes, max_section_bytes,
max_spec_bytes, max_batch_nodes), each on a real store, each checking that a
refusal leaves the stored state exactly as it was.
"""

from __future__ import annotations

import json
import random
from collections.abc import Awaitable, Callable

import pytest
from google.protobuf import any_pb2

from bc.control.base.bus import Bus
from bc.control.commands import queue as commands
from bc.control.nodes.specs import encode_body, set_section, write_spec
from bc.control.quorum import batches as quorum
from bc.control.signing.signer import NullSigner
from bc.errors import UsageError
from bc.protocol import canonical
from bc.protocol.limits import LIMITS
from bc.protocol.pb import common_pb2, kinds_pb2, spec_pb2
from bc.store import Row
from bc.store import commands as cmd_sql
from bc.store import events as events_sql
from bc.store import nodes as nodes_sql
from bc.store.sqlite import InlineSqliteStore

SIGNER = NullSigner()  # signing off, explicitly: a test of signing makes a KeySigner
RNG = random.Random(1)  # ids and serials, as the one seeded Random of a process would give them

AddNode = Callable[..., Awaitable[common_pb2.Inventory]]


def host_section(target_bytes: int) -> str:
    """A valid host section whose JSON text is about `target_bytes`: units of ~1 kB settings each."""
    units = []
    size = 0
    i = 0
    while size < target_bytes:
        unit = {"name": f"u{i:05d}", "settings_json": json.dumps({"v": "x" * 900})}
        size += len(json.dumps(unit)) + 1
        units.append(unit)
        i += 1
    return json.dumps({"units": units})


SECTION_FILLERS: dict[str, Callable[[int], str]] = {
    "host": host_section,
    "access": lambda n: json.dumps(
        {
            "ssh_ca_keys": [
                f"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICgSvCEPeeLHJiWeXDoCuN5bdn6mpHrcxSLMYt/aGFcW {'c' * 920}k{i}"
                for i in range(n // 1020)
            ]
        }
    ),
    "telemetry": lambda n: json.dumps({"resource_attributes": {f"k{i:05d}": "v" * 1000 for i in range(n // 1015)}}),
    "site": lambda n: json.dumps(
        {"cache_images": [{"url": f"https://img.example/{i}/{'p' * 1000}"} for i in range(n // 1040)]}
    ),
    "instances": lambda n: json.dumps(
        {
            "instances": [
                {"id": f"i{i}", "runtime": "qemu", "vcpus": 1, "memory_mib": 256, "kernel": "k", "cmdline": "m" * 940}
                for i in range(n // 1030)
            ]
        }
    ),
}


async def node_row(store: InlineSqliteStore, node_id: str = "n1") -> Row:
    async with store.transaction(write=False) as tx:
        row = await nodes_sql.get(tx, node_id)
    assert row is not None
    return row


async def spec_events(store: InlineSqliteStore) -> int:
    async with store.transaction(write=False) as tx:
        return len(await events_sql.list_events(tx, 0, 1000, "node.spec"))


def stored(row: Row) -> tuple[object, ...]:
    return (row["generation"], row["spec"], row["spec_hash"], row["spec_body"])


# -- max_section_bytes ------------------------------------------------------------------


async def test_a_section_over_max_section_bytes_is_refused_and_nothing_changes(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode
) -> None:
    await add_node("n1", profile=None)
    await set_section(store, bus, SIGNER, "n1", "telemetry", '{"otlp_endpoint": "https://a.example:4317"}')
    before, events = stored(await node_row(store)), await spec_events(store)
    text = host_section(3 * 1024 * 1024)
    with pytest.raises(UsageError) as e:
        await set_section(store, bus, SIGNER, "n1", "host", text)
    assert e.value.message == (
        f"the host section is {len(text.encode()):,} bytes; the limit is 262,144 bytes (max_section_bytes)"
    )
    assert stored(await node_row(store)) == before
    assert await spec_events(store) == events


async def test_a_section_just_under_the_limit_is_stored(store: InlineSqliteStore, bus: Bus, add_node: AddNode) -> None:
    await add_node("n1", profile=None)
    text = host_section(LIMITS.max_section_bytes - 2048)
    assert len(text.encode()) <= LIMITS.max_section_bytes
    w = await set_section(store, bus, SIGNER, "n1", "host", text)
    assert w.changed


# -- max_spec_bytes -------------------------------------------------------------------------


async def test_sections_within_their_limit_that_make_a_spec_over_max_spec_bytes_are_refused(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode
) -> None:
    await add_node("n1", profile=None)
    fillers = list(SECTION_FILLERS.items())
    for section, fill in fillers[:4]:
        await set_section(store, bus, SIGNER, "n1", section, fill(250_000))
    before, events = stored(await node_row(store)), await spec_events(store)
    section, fill = fillers[4]
    with pytest.raises(UsageError) as e:
        await set_section(store, bus, SIGNER, "n1", section, fill(250_000))
    assert "the spec of n1 would be" in e.value.message
    assert e.value.message.endswith("; the limit is 1,048,576 bytes (max_spec_bytes)")
    assert stored(await node_row(store)) == before  # the generation did not move: nothing was written
    assert await spec_events(store) == events
    # and a smaller write still goes through
    w = await set_section(store, bus, SIGNER, "n1", "host", "{}")
    assert w.changed and w.generation == int(before[0]) + 1


async def test_a_spec_stored_over_the_limit_before_it_existed_can_be_made_smaller(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode
) -> None:
    await add_node("n1", profile=None)
    spec = spec_pb2.NodeSpec()
    for i in range(1500):
        spec.host.units.add(name=f"u{i:05d}", settings_json=json.dumps({"v": "x" * 900}))
    text = canonical.spec_to_canonical(spec)
    h = canonical.spec_hash(text)
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        await nodes_sql.write_spec(tx, "n1", 7, text, h, encode_body("n1", 7, spec, h), None, "")
    assert len(text) > LIMITS.max_spec_bytes

    def grow(s: spec_pb2.NodeSpec) -> None:
        s.telemetry.otlp_endpoint = "https://a.example:4317"

    with pytest.raises(UsageError, match=r"\(max_spec_bytes\)"):
        async with store.transaction() as tx:
            await write_spec(tx, bus, SIGNER, "n1", grow, now_ms)
    w = await set_section(store, bus, SIGNER, "n1", "host", "{}")
    assert w.changed and w.generation == 8


# -- max_payload_bytes ------------------------------------------------------------------------


def uuids_payload(n: int) -> str:
    return json.dumps({"gpu_uuids": [f"GPU-{i:08x}-1111-2222-3333-444444444444" for i in range(n)]})


async def commands_of(store: InlineSqliteStore) -> list[Row]:
    async with store.transaction(write=False) as tx:
        return await cmd_sql.list_(tx, node_id="n1", state="", limit=1000)


async def test_a_payload_over_max_payload_bytes_is_refused_before_anything_is_stored(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode
) -> None:
    await add_node("n1", profile=None)
    text = uuids_payload(95_000)
    with pytest.raises(UsageError) as e:
        commands.payload_from_json("diag.nvml", text)
    assert e.value.message == (
        f"the diag.nvml payload is {len(text):,} bytes; the limit is 1,048,576 bytes (max_payload_bytes)"
    )
    # A library caller's payload (jobs, batches) is held to the same limit at enqueue.
    big = any_pb2.Any()
    big.Pack(kinds_pb2.DiagNvmlRequest(gpu_uuids=[f"GPU-{i:08x}-1111-2222-3333-444444444444" for i in range(30_000)]))
    with pytest.raises(UsageError, match=r"the diag\.nvml payload is [\d,]+ bytes; .*\(max_payload_bytes\)"):
        await commands.enqueue(store, bus, SIGNER, commands.EnqueueRequest("n1", "diag.nvml", big), RNG)
    assert await commands_of(store) == []
    # Within the limit: queued.
    ok = commands.payload_from_json("diag.nvml", uuids_payload(20_000))
    assert ok.ByteSize() <= LIMITS.max_payload_bytes
    await commands.enqueue(store, bus, SIGNER, commands.EnqueueRequest("n1", "diag.nvml", ok), RNG)
    assert len(await commands_of(store)) == 1


# -- max_batch_nodes ---------------------------------------------------------------------------


async def test_a_batch_over_max_batch_nodes_is_refused_first(store: InlineSqliteStore, bus: Bus) -> None:
    nodes = [f"n{i}" for i in range(LIMITS.max_batch_nodes + 1)]
    req = quorum.BatchRequest(kind="gpu.reset", node_ids=nodes, payload_json='{"gpu_uuids": []}')
    # Refused for its size before anything else is looked at (no approvers exist here: that would be a Conflict).
    with pytest.raises(UsageError) as e:
        await quorum.create_batch(store, bus, SIGNER, req, "alice", RNG)
    assert e.value.message == "the batch's node list has 10,001; the limit is 10,000 (max_batch_nodes)"
    big_payload = quorum.BatchRequest(kind="gpu.reset", node_ids=["n1"], payload_json=uuids_payload(30_000))
    with pytest.raises(UsageError, match=r"\(max_payload_bytes\)"):
        await quorum.create_batch(store, bus, SIGNER, big_payload, "alice", RNG)
