"""The NodeSpec writer and canonical JSON: a new generation exactly when the desired state changes."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bc.control.base.bus import Bus
from bc.control.nodes.specs import SpecWrite, set_section, write_spec
from bc.control.signing.signer import NullSigner
from bc.errors import NotFound, UsageError
from bc.protocol import canonical
from bc.protocol.pb import common_pb2, spec_pb2
from bc.protocol.pb.session_pb2 import DesiredStateBody
from bc.store import Row
from bc.store import events as events_sql
from bc.store import nodes as nodes_sql
from bc.store.sqlite import InlineSqliteStore

SIGNER = NullSigner()  # signing off, explicitly: a test of signing makes a KeySigner

AddNode = Callable[..., Awaitable[common_pb2.Inventory]]
Mutate = Callable[[spec_pb2.NodeSpec], None]


async def node_row(store: InlineSqliteStore, node_id: str = "n1") -> Row:
    async with store.transaction(write=False) as tx:
        row = await nodes_sql.get(tx, node_id)
    assert row is not None
    return row


async def spec_events(store: InlineSqliteStore) -> list[Row]:
    async with store.transaction(write=False) as tx:
        return await events_sql.list_events(tx, 0, 1000, "node.spec")


def set_telemetry(endpoint: str) -> Mutate:
    def mutate(spec: spec_pb2.NodeSpec) -> None:
        spec.telemetry.otlp_endpoint = endpoint

    return mutate


def nothing(spec: spec_pb2.NodeSpec) -> None:
    pass


async def write(store: InlineSqliteStore, bus: Bus | None, mutate: Mutate, node_id: str = "n1") -> SpecWrite:
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        return await write_spec(tx, bus, SIGNER, node_id, mutate, now_ms)


# -- write_spec --------------------------------------------------------------------


async def test_a_mutation_bumps_the_generation_by_one_and_stores_the_body(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode
) -> None:
    await add_node("n1", profile=None)
    poked: list[str] = []
    bus.on_node_changed(poked.append)
    w1 = await write(store, bus, set_telemetry("https://a.example:4317"))
    assert w1.changed and w1.generation == 1
    w2 = await write(store, bus, set_telemetry("https://b.example:4317"))
    assert w2.changed and w2.generation == 2
    row = await node_row(store)
    assert int(row["generation"]) == 2
    assert row["spec_hash"] == w2.spec_hash == canonical.spec_hash(str(row["spec"]))
    body = DesiredStateBody()
    body.ParseFromString(bytes(row["spec_body"]))
    assert body.node_id == "n1"
    assert body.generation == 2
    assert body.spec_hash == w2.spec_hash
    assert body.WhichOneof("content") == "full"
    assert body.full == canonical.spec_from_json(str(row["spec"]))
    assert body.full.telemetry.otlp_endpoint == "https://b.example:4317"
    assert body.base_generation == 0
    assert poked == ["n1", "n1"]
    assert [json.loads(e["data"])["generation"] for e in await spec_events(store)] == [1, 2]


async def test_the_first_write_of_an_empty_spec_creates_generation_one(
    store: InlineSqliteStore, add_node: AddNode
) -> None:
    await add_node("n1", profile=None)
    assert int((await node_row(store))["generation"]) == 0
    w = await write(store, None, nothing)
    assert w.changed and w.generation == 1
    row = await node_row(store)
    assert int(row["generation"]) == 1
    assert row["spec_body"] is not None
    again = await write(store, None, nothing)
    assert not again.changed
    assert again.generation == 1
    assert again.spec_hash == w.spec_hash


async def test_writing_the_same_spec_again_does_not_bump(store: InlineSqliteStore, bus: Bus, add_node: AddNode) -> None:
    await add_node("n1", profile=None)
    first = await write(store, bus, set_telemetry("https://a.example:4317"))
    body_before = (await node_row(store))["spec_body"]
    poked: list[str] = []
    bus.on_node_changed(poked.append)
    for _ in range(3):
        w = await write(store, bus, set_telemetry("https://a.example:4317"))
        assert not w.changed
        assert w.generation == first.generation
    row = await node_row(store)
    assert int(row["generation"]) == first.generation
    assert row["spec_body"] == body_before
    assert poked == []
    assert len(await spec_events(store)) == 1


async def test_an_empty_section_is_no_change(store: InlineSqliteStore, add_node: AddNode) -> None:
    """The canonical JSON omits defaults: an empty section and an absent one are the same spec."""
    await add_node("n1", profile=None)
    first = await write(store, None, nothing)

    def touch(spec: spec_pb2.NodeSpec) -> None:
        spec.telemetry.SetInParent()

    w = await write(store, None, touch)
    assert not w.changed
    assert w.generation == first.generation


async def test_write_spec_for_an_unknown_node_is_not_found(store: InlineSqliteStore) -> None:
    with pytest.raises(NotFound):
        await write(store, None, nothing, node_id="nope")


async def test_a_failed_transaction_stores_no_generation(store: InlineSqliteStore, add_node: AddNode) -> None:
    await add_node("n1", profile=None)
    now_ms = await store.now_ms()
    with pytest.raises(RuntimeError):
        async with store.transaction() as tx:
            await write_spec(tx, None, SIGNER, "n1", set_telemetry("https://x"), now_ms)
            raise RuntimeError("boom")
    row = await node_row(store)
    assert int(row["generation"]) == 0
    assert row["spec_body"] is None
    assert await spec_events(store) == []


# -- set_section ---------------------------------------------------------------------


async def test_set_section_replaces_a_section_wholesale(store: InlineSqliteStore, bus: Bus, add_node: AddNode) -> None:
    await add_node("n1", profile=None)
    await set_section(store, bus, SIGNER, "n1", "telemetry", '{"otlp_endpoint": "https://a", "export_interval_s": 30}')
    w = await set_section(store, bus, SIGNER, "n1", "telemetry", '{"otlp_endpoint": "https://b"}')
    assert w.changed
    spec = canonical.spec_from_json(str((await node_row(store))["spec"]))
    assert spec.telemetry.otlp_endpoint == "https://b"
    assert spec.telemetry.export_interval_s == 0


@pytest.mark.parametrize(
    ("section", "text"),
    [
        ("telemetry", "{not json"),
        ("telemetry", '{"otlp_endpoint": 12, "nope": true}'),
        ("telemetry", '{"no_such_field": "x"}'),
        ("access", "[1, 2]"),
        ("nosuchsection", "{}"),
        ("host", '{"units": [{"name": "../../etc/cron.d/x"}]}'),
        ("host", '{"units": [{"name": "sysctl", "settings_json": "[1]"}]}'),
        ("telemetry", '{"otlp_endpoint": "http://[::1/x"}'),
        ("telemetry", '{"resource_attributes": {"rack": "r1\\u001b]0;pwned\\u0007"}}'),
        ("access", '{"principals": ["root\\u202e"]}'),
    ],
)
async def test_set_section_with_bad_input_is_a_usage_error_and_changes_nothing(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode, section: str, text: str
) -> None:
    await add_node("n1", profile=None)
    await set_section(store, bus, SIGNER, "n1", "telemetry", '{"otlp_endpoint": "https://a"}')
    before = await node_row(store)
    events_before = await spec_events(store)
    with pytest.raises(UsageError) as ei:
        await set_section(store, bus, SIGNER, "n1", section, text)
    assert isinstance(ei.value, canonical.SpecError)
    after = await node_row(store)
    assert {k: after[k] for k in ("spec", "spec_hash", "spec_body", "generation")} == {
        k: before[k] for k in ("spec", "spec_hash", "spec_body", "generation")
    }
    assert await spec_events(store) == events_before


async def test_set_section_refuses_the_devices_section(store: InlineSqliteStore, bus: Bus, add_node: AddNode) -> None:
    await add_node("n1", profile=None)
    before = await node_row(store)
    devices = '{"assignments": [{"allocation_id": "a1", "devices": [{"device_class": "gpu", "atom_id": "GPU-x"}]}]}'
    with pytest.raises(UsageError, match="reservations"):
        await set_section(store, bus, SIGNER, "n1", "devices", devices)
    with pytest.raises(UsageError):
        await set_section(store, bus, SIGNER, "n1", "devices", "{}")
    after = await node_row(store)
    assert after["spec"] == before["spec"]
    assert after["generation"] == before["generation"]


async def test_set_section_with_empty_object_clears_the_section(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode
) -> None:
    await add_node("n1", profile=None)
    await set_section(store, bus, SIGNER, "n1", "access", '{"principals": ["ops"]}')
    w_set = await set_section(store, bus, SIGNER, "n1", "telemetry", '{"otlp_endpoint": "https://a"}')
    w = await set_section(store, bus, SIGNER, "n1", "telemetry", "{}")
    assert w.changed
    assert w.generation == w_set.generation + 1
    row = await node_row(store)
    spec = canonical.spec_from_json(str(row["spec"]))
    assert not spec.HasField("telemetry")
    assert "telemetry" not in json.loads(str(row["spec"]))
    assert list(spec.access.principals) == ["ops"]
    again = await set_section(store, bus, SIGNER, "n1", "telemetry", "{}")
    assert not again.changed
    assert again.generation == w.generation


async def test_set_section_on_an_unknown_node_is_not_found(store: InlineSqliteStore, bus: Bus) -> None:
    with pytest.raises(NotFound):
        await set_section(store, bus, SIGNER, "ghost", "telemetry", '{"otlp_endpoint": "https://a"}')


# -- canonical JSON -------------------------------------------------------------------

_text = st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=12)
_key = st.text(alphabet="abcdefghijklmnopqrstuvwxyz._-", min_size=1, max_size=8)

# Each setter writes one field (or one map entry) with a non-default value.
_setters = st.one_of(
    st.tuples(st.just("otlp_endpoint"), _text),
    st.tuples(st.just("export_interval_s"), st.integers(min_value=1, max_value=3600)),
    st.tuples(st.just("headers_secret_ref"), _text),
    st.tuples(st.just("attr"), st.tuples(_key, _text)),
    st.tuples(st.just("principals"), st.lists(_text, min_size=1, max_size=3)),
    st.tuples(st.just("jwks"), _text),
    st.tuples(st.just("daemon_version"), _text),
    st.tuples(st.just("daemon_signature"), st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("boot_lease_state"), _text),
    st.tuples(st.just("unit"), st.tuples(_key, _text)),
    st.tuples(
        st.just("assignment"), st.tuples(_key, st.sampled_from(["gpu", "gpu.mig"]), _key, st.sampled_from([1, 2]))
    ),
)


def apply(spec: spec_pb2.NodeSpec, setter: tuple[str, Any]) -> None:
    name, value = setter
    if name == "otlp_endpoint":
        spec.telemetry.otlp_endpoint = str(value)
    elif name == "export_interval_s":
        spec.telemetry.export_interval_s = value
    elif name == "headers_secret_ref":
        spec.telemetry.headers_secret_ref = str(value)
    elif name == "attr":
        k, v = value
        spec.telemetry.resource_attributes[k] = v
    elif name == "principals":
        del spec.access.principals[:]
        spec.access.principals.extend(value)
    elif name == "jwks":
        spec.access.exec_ticket_jwks = str(value)
    elif name == "daemon_version":
        spec.daemon.version = str(value)
    elif name == "daemon_signature":
        spec.daemon.signature = value
    elif name == "boot_lease_state":
        spec.site.boot_lease_state = str(value)
    elif name == "unit":
        n, s = value
        spec.host.units.add(name=n, settings_json=s)
    elif name == "assignment":
        alloc, cls, atom, binding = value
        a = spec.devices.assignments.add(allocation_id=alloc, binding=binding)
        a.devices.add(device_class=cls, atom_id=atom)


def _last_writer_wins(setters: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """Keep setters whose result does not depend on order: one per scalar field / map key, no list appends."""
    seen: dict[object, tuple[str, Any]] = {}
    for name, value in setters:
        if name in ("unit", "assignment"):
            continue
        key: object = (name, value[0]) if name == "attr" else name
        seen[key] = (name, value)
    return list(seen.values())


@given(setters=st.lists(_setters, max_size=12), data=st.data())
def test_canonical_json_does_not_depend_on_the_order_fields_were_set(
    setters: list[tuple[str, Any]], data: st.DataObject
) -> None:
    independent = _last_writer_wins(setters)
    shuffled = data.draw(st.permutations(independent))
    a, b = spec_pb2.NodeSpec(), spec_pb2.NodeSpec()
    for s in independent:
        apply(a, s)
    for s in shuffled:
        apply(b, s)
    assert canonical.spec_to_canonical(a) == canonical.spec_to_canonical(b)
    assert canonical.spec_hash(canonical.spec_to_canonical(a)) == canonical.spec_hash(canonical.spec_to_canonical(b))


@given(entries=st.dictionaries(_key, _text, max_size=8), data=st.data())
def test_canonical_json_does_not_depend_on_map_insertion_order(entries: dict[str, str], data: st.DataObject) -> None:
    order = data.draw(st.permutations(list(entries.items())))
    a, b = spec_pb2.NodeSpec(), spec_pb2.NodeSpec()
    for k, v in entries.items():
        a.telemetry.resource_attributes[k] = v
    for k, v in order:
        b.telemetry.resource_attributes[k] = v
    assert canonical.spec_to_canonical(a) == canonical.spec_to_canonical(b)


@given(setters=st.lists(_setters, max_size=12))
def test_canonical_json_parses_back_to_the_same_spec(setters: list[tuple[str, Any]]) -> None:
    spec = spec_pb2.NodeSpec()
    for s in setters:
        apply(spec, s)
    text = canonical.spec_to_canonical(spec)
    back = canonical.spec_from_json(text)
    assert back == spec
    assert canonical.spec_to_canonical(back) == text


def test_canonical_json_is_compact_with_sorted_keys_and_proto_names() -> None:
    spec = spec_pb2.NodeSpec()
    spec.telemetry.resource_attributes["b"] = "2"
    spec.telemetry.resource_attributes["a"] = "1"
    spec.telemetry.export_interval_s = 5
    text = canonical.spec_to_canonical(spec)
    assert text == '{"telemetry":{"export_interval_s":5,"resource_attributes":{"a":"1","b":"2"}}}'


def test_an_empty_section_and_an_absent_one_are_the_same_spec() -> None:
    empty = spec_pb2.NodeSpec()
    empty.telemetry.SetInParent()
    assert canonical.spec_to_canonical(empty) == canonical.spec_to_canonical(spec_pb2.NodeSpec())
