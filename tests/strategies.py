"""Hypothesis strategies for any protobuf message of ours, hostile by design.

`messages(Descriptor)` builds a strategy from the message's descriptor, so
every request and frame type gets one without a hand-written strategy that
would fall behind the .proto files. Field values lean on what breaks
things: control and bidirectional characters, text over every size limit,
deeply nested JSON, int32/int64 boundaries, unknown enum numbers, bytes that
are not what they claim to be, plus plausible values (node ids, section
names, kinds) so that some requests get past the first check.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import strategies as st

INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)

PLAUSIBLE = [
    "",
    "n1",
    "n2",
    "local",
    "gpu",
    "gpu.mig",
    "hold",
    "host",
    "devices",
    "telemetry",
    "access",
    "inventory.refresh",
    "diag.nvml",
    "gpu.reset",
    "logs.collect",
    "node.reboot",
    "{}",
    '{"otlp_endpoint": "http://127.0.0.1:4317"}',
    '{"units": [{"name": "sysctl", "settings_json": "{}"}]}',
    '{"gpu_uuids": ["GPU-0"]}',
    "pending",
    "node.",
    "security.",
    "node_",
    "%",
]

HOSTILE_TEXT = [
    "n1\n",
    "n9\x00",
    "../../etc/passwd",
    "\x1b]0;owned\x07",
    "a\u202eb",
    "\ud7ff\ue000\U0010ffff",
    "[" * 5_000,
    '{"a":' * 3_000 + "1" + "}" * 3_000,
    "x" * 70_000,
]

# Built once: hypothesis shrinks these by choosing a smaller one, never by building a smaller string.
HUGE_TEXT = ["y" * 300_000, "z" * 1_100_000]


def _text(hostile: bool) -> st.SearchStrategy[str]:
    options: list[st.SearchStrategy[str]] = [
        st.sampled_from(PLAUSIBLE),
        st.text(max_size=40),
        st.sampled_from(HOSTILE_TEXT),
    ]
    if hostile:
        options.append(st.sampled_from(HUGE_TEXT))
    return st.one_of(*options)


def _int(lo: int, hi: int) -> st.SearchStrategy[int]:
    return st.one_of(
        st.sampled_from([0, 1, -1, lo, hi, 2**31 - 1, 1024, 1025, 10_000]).filter(lambda v: lo <= v <= hi),
        st.integers(lo, hi),
    )


def _scalar(fd: FieldDescriptor, hostile: bool) -> st.SearchStrategy[Any]:
    t = fd.type
    if t == FieldDescriptor.TYPE_STRING:
        return _text(hostile)
    if t == FieldDescriptor.TYPE_BYTES:
        return st.one_of(st.binary(max_size=64), st.just(b"\x00" * 100_000) if hostile else st.just(b""))
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t in (FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SFIXED32):
        return _int(*INT32)
    if t in (FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64, FieldDescriptor.TYPE_SFIXED64):
        return _int(*INT64)
    if t in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32):
        return _int(0, 2**32 - 1)
    if t in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64):
        return _int(0, 2**64 - 1)
    if t == FieldDescriptor.TYPE_ENUM:
        assert fd.enum_type is not None
        known = [v.number for v in fd.enum_type.values]
        return st.one_of(st.sampled_from(known), st.integers(-5, 1000))  # proto3 enums are open
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.floats(allow_nan=False, width=32)
    raise NotImplementedError(f"no strategy for field {fd.full_name} of type {t}")


def messages(desc: Descriptor, *, depth: int = 3, hostile: bool = True) -> st.SearchStrategy[Message]:
    """A strategy for messages of `desc`: each field present or not, nested up to `depth` levels."""
    cls = GetMessageClass(desc)

    @st.composite
    def build(draw: st.DrawFn) -> Message:
        msg = cls()
        oneofs_done: set[str] = set()
        for fd in desc.fields:
            oneof = fd.containing_oneof
            if oneof is not None and oneof.name in oneofs_done:
                continue
            if not draw(st.booleans()):
                continue
            if oneof is not None:
                oneofs_done.add(oneof.name)
            _fill(draw, msg, fd, depth, hostile)
        return msg

    return build()


def _fill(draw: st.DrawFn, msg: Message, fd: FieldDescriptor, depth: int, hostile: bool) -> None:
    target: Any = getattr(msg, fd.name)
    if fd.type == FieldDescriptor.TYPE_MESSAGE:
        sub = fd.message_type
        assert sub is not None
        if sub.GetOptions().map_entry:
            key_fd, value_fd = sub.fields_by_name["key"], sub.fields_by_name["value"]
            for _ in range(draw(st.integers(0, 3))):
                k = draw(_scalar(key_fd, hostile=False))
                if value_fd.type == FieldDescriptor.TYPE_MESSAGE:
                    if depth > 0:
                        assert value_fd.message_type is not None
                        target[k].CopyFrom(draw(messages(value_fd.message_type, depth=depth - 1, hostile=hostile)))
                else:
                    target[k] = draw(_scalar(value_fd, hostile))
            return
        if depth <= 0:
            return
        if sub.full_name == "google.protobuf.Any":
            return  # an Any carries a type_url the servers look up; left empty it stays well-formed
        if fd.is_repeated:
            for _ in range(draw(st.integers(0, 2))):
                target.add().CopyFrom(draw(messages(sub, depth=depth - 1, hostile=hostile)))
        else:
            target.CopyFrom(draw(messages(sub, depth=depth - 1, hostile=hostile)))
        return
    if fd.is_repeated:
        target.extend(draw(st.lists(_scalar(fd, hostile), max_size=3)))
    else:
        setattr(msg, fd.name, draw(_scalar(fd, hostile)))
