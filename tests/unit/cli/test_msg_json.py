"""`bc.cli.msg_json` prints what `json_format` printed: the same keys, order and values, byte for byte.

`reference` below is the CLI's JSON form as it was built on `json_format` until 2026-12-03 (MessageToDict
with proto field names and every field without presence, then reordered by field number with 64-bit
integers unquoted). Every message type of our protos is compared at its defaults and filled in two ways:
ordinary values, and the edges (int64 and uint64 extremes, NaN and infinities, -0.0, bytes that are not
UTF-8, control and bidi characters, an enum number the enum does not name, optional fields set to their
default, empty repeated fields and maps, nested messages).
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any, cast

import pytest
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message

from bc.cli.msg_json import message_json_text, message_to_json
from bc.cli.output import JsonArray, json_text
from bc.protocol.pb import admin_pb2, common_pb2, join_pb2, kinds_pb2, session_pb2, spec_pb2

# -- the older form, kept as it was ---------------------------------------------

_INT64_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
    }
)


def reference(msg: Message) -> dict[str, Any]:
    raw = json_format.MessageToDict(msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    return _normalize(cast(Descriptor, msg.DESCRIPTOR), raw)


def _normalize(desc: Descriptor, obj: dict[str, Any]) -> dict[str, Any]:
    if desc.full_name.startswith("google.protobuf."):
        return obj
    out: dict[str, Any] = {}
    for field in sorted(desc.fields, key=lambda f: f.number):
        if field.name not in obj:
            continue
        out[field.name] = _normalize_value(field, obj[field.name])
    for key, value in obj.items():
        out.setdefault(key, value)
    return out


def _normalize_value(field: FieldDescriptor, value: Any) -> Any:
    sub = field.message_type
    if sub is not None and sub.GetOptions().map_entry:
        value_field = sub.fields_by_name["value"]
        return {k: _normalize_scalar(value_field, v) for k, v in value.items()}
    if isinstance(value, list):
        return [_normalize_scalar(field, v) for v in value]
    return _normalize_scalar(field, value)


def _normalize_scalar(field: FieldDescriptor, value: Any) -> Any:
    if field.message_type is not None and isinstance(value, dict):
        return _normalize(field.message_type, value)
    if field.type in _INT64_TYPES and isinstance(value, str):
        return int(value)
    return value


# -- messages to compare -----------------------------------------------------------

MODULES = (admin_pb2, common_pb2, spec_pb2, session_pb2, join_pb2, kinds_pb2)


def all_message_types() -> list[Descriptor]:
    found: list[Descriptor] = []

    def walk(desc: Descriptor) -> None:
        if desc.GetOptions().map_entry:
            return
        found.append(desc)
        for nested in desc.nested_types:
            walk(nested)

    for module in MODULES:
        for desc in module.DESCRIPTOR.message_types_by_name.values():
            walk(desc)
    return found


def _class(desc: Descriptor) -> type[Message]:
    from google.protobuf import message_factory

    return message_factory.GetMessageClass(desc)


ORDINARY: dict[int, Any] = {
    FieldDescriptor.CPPTYPE_INT32: 7,
    FieldDescriptor.CPPTYPE_INT64: 1_700_000_000_000,
    FieldDescriptor.CPPTYPE_UINT32: 9,
    FieldDescriptor.CPPTYPE_UINT64: 12_345_678_901,
    FieldDescriptor.CPPTYPE_DOUBLE: 2.5,
    FieldDescriptor.CPPTYPE_FLOAT: 0.1,
    FieldDescriptor.CPPTYPE_BOOL: True,
}

EDGE: dict[int, list[Any]] = {
    FieldDescriptor.CPPTYPE_INT32: [-(2**31), 2**31 - 1],
    FieldDescriptor.CPPTYPE_INT64: [-(2**63), 2**63 - 1],
    FieldDescriptor.CPPTYPE_UINT32: [2**32 - 1, 0],
    FieldDescriptor.CPPTYPE_UINT64: [2**64 - 1, 0],
    FieldDescriptor.CPPTYPE_DOUBLE: [float("nan"), float("inf"), float("-inf"), -0.0, 1e300, 5e-324],
    FieldDescriptor.CPPTYPE_FLOAT: [float("inf"), 3.4e38, -0.0],
    FieldDescriptor.CPPTYPE_BOOL: [False],
}


def _scalar(field: FieldDescriptor, edge: bool, i: int) -> Any:
    cpp = field.cpp_type
    if cpp == FieldDescriptor.CPPTYPE_ENUM:
        enum = cast(EnumDescriptor, field.enum_type)
        numbers = sorted(enum.values_by_number)
        if edge and not enum.is_closed:
            return max(numbers) + 40  # a number the enum does not name
        return numbers[(i + 1) % len(numbers)]
    if cpp == FieldDescriptor.CPPTYPE_STRING:
        if field.type == FieldDescriptor.TYPE_BYTES:
            return b"\xff\x00\xfe bytes" if edge else f"pem-{i}".encode()
        return ["n\x1b[31m\u202e é 日本", "", 'a\nb\t"q"\\'][i % 3] if edge else f"{field.name}-{i}"
    if edge:
        values = EDGE[cpp]
        return values[i % len(values)]
    return ORDINARY[cpp]


def fill(msg: Message, *, edge: bool, depth: int = 0) -> Message:
    """Every field of `msg` set (nested messages to depth 3); repeated fields get two elements."""
    for field in cast(Descriptor, msg.DESCRIPTOR).fields:
        name = field.name
        sub = field.message_type
        if sub is not None and sub.GetOptions().map_entry:
            key_field, value_field = sub.fields_by_name["key"], sub.fields_by_name["value"]
            container = getattr(msg, name)
            if edge and depth > 0:
                continue  # an empty map
            for i in range(3):
                key: Any = f"k{2 - i}" if key_field.cpp_type == FieldDescriptor.CPPTYPE_STRING else i
                if value_field.message_type is not None:
                    if depth < 3:
                        fill(container[key], edge=edge, depth=depth + 1)
                else:
                    container[key] = _scalar(value_field, edge, i)
        elif field.is_repeated:
            if edge and depth > 0:
                continue  # an empty repeated field
            for i in range(2):
                if sub is not None:
                    if depth < 3:
                        element = getattr(msg, name).add()
                        if i == 0:
                            fill(element, edge=edge, depth=depth + 1)  # the second stays at its defaults
                else:
                    getattr(msg, name).append(_scalar(field, edge, i))
        elif sub is not None and sub.full_name == "google.protobuf.Any":
            getattr(msg, name).Pack(fill(kinds_pb2.LogsCollectRequest(), edge=edge, depth=depth + 1))  # as the kinds do
        elif sub is not None:
            if depth < 3:
                fill(getattr(msg, name), edge=edge, depth=depth + 1)
        elif field.has_presence and edge:
            setattr(msg, name, field.default_value)  # set, at its default: printed, as a set field is
        else:
            setattr(msg, name, _scalar(field, edge, field.number))
    return msg


CASES = [
    pytest.param(desc.full_name, variant, id=f"{desc.full_name}-{variant}")
    for desc in all_message_types()
    for variant in ("default", "ordinary", "edge")
]


def build(full_name: str, variant: str) -> Message:
    desc = next(d for d in all_message_types() if d.full_name == full_name)
    msg = _class(desc)()
    if variant != "default":
        fill(msg, edge=variant == "edge")
    return msg


def printed(doc: Any) -> str:
    """What `--json` prints (and, on one line, what `--follow` streams): the key order counts."""
    return json_text(doc) + "\n" + json_text(doc, indent=None)


@pytest.mark.parametrize(("full_name", "variant"), CASES)
def test_every_message_prints_as_json_format_did(full_name: str, variant: str) -> None:
    msg = build(full_name, variant)
    assert printed(message_to_json(msg)) == printed(reference(msg))


def _streamed(pages: list[list[Message]]) -> str:
    """What `bc nodes --json` prints for these pages of messages, as they arrive (`JsonArray`)."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        array = JsonArray()
        for page in pages:
            array.add_texts([message_json_text(m, "  ") for m in page])
        array.close()
    return out.getvalue()


@pytest.mark.parametrize(("full_name", "variant"), CASES)
def test_every_message_streams_as_the_whole_list_prints(full_name: str, variant: str) -> None:
    """The streamed array is byte for byte the list `emit` prints (`json_text` of the dicts), escapes included."""
    msg = build(full_name, variant)
    whole = json_text([message_to_json(msg), message_to_json(msg)]) + "\n"
    assert _streamed([[msg], [msg]]) == _streamed([[msg, msg]]) == whole
    assert message_json_text(msg) == json.dumps(message_to_json(msg), indent=2, ensure_ascii=False)


def test_an_empty_listing_streams_as_an_empty_list() -> None:
    assert _streamed([]) == _streamed([[], []]) == json_text([]) + "\n" == "[]\n"


def test_the_cases_cover_what_the_protos_hold() -> None:
    """The comparison above is only as good as the messages it sees: they hold every kind of field."""
    seen: set[str] = set()
    for desc in all_message_types():
        for field in desc.fields:
            sub = field.message_type
            if sub is not None and sub.GetOptions().map_entry:
                seen.add("map")
            elif field.is_repeated:
                seen.add("repeated")
            if field.has_presence and sub is None:
                seen.add("optional scalar")
            seen.add(f"type {field.type}")
    expected = {"map", "repeated", "optional scalar"} | {
        f"type {t}"
        for t in (
            FieldDescriptor.TYPE_STRING,
            FieldDescriptor.TYPE_BYTES,
            FieldDescriptor.TYPE_BOOL,
            FieldDescriptor.TYPE_INT32,
            FieldDescriptor.TYPE_INT64,
            FieldDescriptor.TYPE_UINT64,
            FieldDescriptor.TYPE_DOUBLE,
            FieldDescriptor.TYPE_ENUM,
            FieldDescriptor.TYPE_MESSAGE,
        )
    }
    assert expected <= seen, expected - seen
    assert len(CASES) > 300


def test_a_node_as_bc_nodes_prints_it() -> None:
    node = admin_pb2.NodeInfo(
        node_id="n1",
        role="node",
        state="connected",
        generation=3,
        last_seen_age_ms=5567,
        sections=[
            common_pb2.SectionStatus(section="access", state=common_pb2.FAILED, generation=3, reason="InvalidAccess"),
            common_pb2.SectionStatus(section="host"),
        ],
        capabilities=["binding.kubernetes", "devices.cdi"],
        labels={"pool": "a100", "bc.dev/cap.devices.cdi": "1", "": ""},
        cert_not_after_ms=1_796_382_136_000,
        no_schedule=[],
    )
    node.inventory.cpus = 224
    gpu = node.inventory.gpus.add(uuid="GPU-1", memory_mib=81559)
    gpu.numa_node = 0  # optional, set to its default: present
    node.inventory.gpus.add(uuid="GPU-2")  # numa_node unset: absent
    doc = message_to_json(node)
    assert printed(doc) == printed(reference(node))
    assert doc["cert_not_after_ms"] == 1_796_382_136_000 and doc["sections"][0]["state"] == "FAILED"
    gpus = doc["inventory"]["gpus"]
    assert gpus[0]["numa_node"] == 0 and "numa_node" not in gpus[1] and gpus[0]["memory_mib"] == 81559
    assert list(doc["labels"]) == list(node.labels)  # the map in the order the message holds it


def test_the_edges_are_what_the_comparison_says_they_are() -> None:
    """A sanity check of the filler: the edge variant really holds the edge values."""
    msg = cast(admin_pb2.NodeInfo, build("bc.v1.NodeInfo", "edge"))
    doc = message_to_json(msg)
    assert isinstance(doc["generation"], int) and abs(doc["generation"]) >= 2**62
    assert isinstance(doc["sections"][0]["state"], int)  # a number the enum does not name stays a number
    assert doc["sections"][1] == reference(common_pb2.SectionStatus())
    assert doc["sections"][0]["generation"] in (-(2**63), 2**63 - 1)
    assert sorted(doc["labels"]) == ["k0", "k1", "k2"]
    assert doc["revoke_reason"] in ("n\x1b[31m\u202e é 日本", "", 'a\nb\t"q"\\')


def test_a_well_known_type_keeps_its_own_shape() -> None:
    from google.protobuf import struct_pb2, timestamp_pb2

    stamp = timestamp_pb2.Timestamp(seconds=1_700_000_000, nanos=5)
    assert printed(message_to_json(stamp)) == printed(reference(stamp)) == printed("2023-11-14T22:13:20.000000005Z")
    struct = struct_pb2.Struct()
    struct.update({"a": [1, "x", None], "b": {"c": True}})
    assert printed(message_to_json(struct)) == printed(reference(struct))


def test_bc_nodes_renders_without_json_format() -> None:
    """The point of the module: a `--json` reply is rendered without loading json_format or descriptor_pb2."""
    code = (
        "import sys\n"
        "from bc.cli import admin_cmds\n"
        "from bc.cli.emit import emit\n"
        "from bc.protocol.pb import admin_pb2\n"
        "emit(True, [admin_pb2.NodeInfo(node_id='n1', labels={'a': 'b'})])\n"
        "heavy = ('google.protobuf.json_format', 'google.protobuf.descriptor_pb2', 'cryptography', 'textual')\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)), file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout)[0]["labels"] == {"a": "b"}
    assert done.stderr.strip() == "[]"
