"""agent.helper.wire: frames round-trip, and no bytes decode to anything but an object or a WireError."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.helper import wire

json_objects = st.dictionaries(
    st.text(max_size=10),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=30),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
        max_leaves=10,
    ),
    max_size=6,
)


@given(json_objects)
@settings(max_examples=300, deadline=None)
def test_an_object_round_trips(obj: dict[str, Any]) -> None:
    assert wire.decode(wire.encode(obj)) == obj


@given(st.binary(max_size=200))
@settings(max_examples=1500, deadline=None)
def test_any_bytes_decode_to_an_object_or_a_wire_error(data: bytes) -> None:
    try:
        assert isinstance(wire.decode(data), dict)
    except wire.WireError:
        pass
    try:
        assert isinstance(wire.decode(struct.pack(">I", len(data)) + data), dict)
    except wire.WireError:
        pass


def test_a_frame_over_the_limit_is_refused_before_its_body_is_read() -> None:
    with pytest.raises(wire.WireError, match="over the"):
        wire.decode_length(struct.pack(">I", wire.MAX_FRAME + 1))


def test_deep_nesting_is_a_wire_error_not_a_crash() -> None:
    body = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(wire.WireError):
        wire.decode(struct.pack(">I", len(body)) + body)


async def test_frames_read_from_a_stream_in_order() -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(wire.encode({"a": 1}) + wire.encode({"b": 2}))
    reader.feed_eof()
    assert await wire.read_frame(reader) == {"a": 1}
    assert await wire.read_frame(reader) == {"b": 2}
    with pytest.raises(asyncio.IncompleteReadError):
        await wire.read_frame(reader)
