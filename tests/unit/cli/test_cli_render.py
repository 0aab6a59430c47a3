"""Durations, ages, tables and the JSON form of messages, as the CLI prints them."""

from __future__ import annotations

import json

import pytest

from bc.cli.render import (
    cell,
    format_age,
    format_duration,
    format_mib,
    format_time_ms,
    message_to_json,
    parse_duration,
    render_fields,
    render_table,
)
from bc.errors import UsageError
from bc.protocol.pb import admin_pb2, common_pb2


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("10m", 600), ("1h", 3600), ("2d", 172800), ("45", 45), (" 1H30m ", 5400), ("1d2h", 93600)],
)
def test_parse_duration(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "1.5h", "-5", "h", "10x", "1h 30m", "0", "0s"])
def test_parse_duration_refuses_with_one_sentence(text: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_duration(text, what="--ttl")
    assert info.value.message.startswith(f"the --ttl {text!r} ")
    assert "\n" not in info.value.message


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (45, "45s"),
        (90, "1m30s"),
        (600, "10m"),
        (3600, "1h"),
        (5400, "1h30m"),
        (86405, "1d"),
        (90000, "1d1h"),
    ],
)
def test_format_duration(seconds: int, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize("seconds", [1, 59, 90, 600, 3600, 5400, 86400, 172800])
def test_format_duration_reads_back(seconds: int) -> None:
    # What `bc token create` prints as "expires in ..." is a --ttl the operator could type back.
    assert parse_duration(format_duration(seconds)) == seconds


@pytest.mark.parametrize(
    ("age_ms", "text"),
    [
        (-1, "never"),
        (0, "0s ago"),
        (3_999, "3s ago"),
        (59_999, "59s ago"),
        (60_000, "1m ago"),
        (300_000, "5m ago"),
        (3_600_000, "1h ago"),
        (7_200_000, "2h ago"),
        (47 * 3_600_000, "47h ago"),
        (3 * 86_400_000, "3d ago"),
    ],
)
def test_format_age(age_ms: int, text: str) -> None:
    assert format_age(age_ms) == text


def test_format_time_and_memory() -> None:
    assert format_time_ms(1_000) == "1970-01-01T00:00:01Z"
    assert format_mib(81920) == "80 GiB"
    assert format_mib(1536) == "1.5 GiB"
    assert format_mib(512) == "512 MiB"


def test_render_table_aligns_columns_without_trailing_blanks() -> None:
    out = render_table(("NODE", "STATE", "GEN"), [("n1", "connected", 4), ("node-22", "new", "")])
    assert list(out) == [
        "NODE     STATE      GEN",
        "n1       connected  4",
        "node-22  new        -",
    ]


def test_render_table_keeps_each_row_on_one_line() -> None:
    out = render_table(("A", "B"), [("x", "two\nlines  here")])
    assert list(out) == ["A  B", "x  two lines here"]


def test_render_table_refuses_a_ragged_row() -> None:
    with pytest.raises(ValueError):
        render_table(("A", "B"), [("only one",)])


def test_cell_cuts_long_text() -> None:
    assert cell("abcdefghij", width=5) == "abcd…"
    assert cell("abc", width=5) == "abc"


def test_render_fields() -> None:
    assert list(render_fields([("node", "n1"), ("generation", 4), ("boot id", "")])) == [
        "node        n1",
        "generation  4",
        "boot id     -",
    ]


def test_message_to_json_keeps_descriptor_order_defaults_and_integer_int64() -> None:
    info = admin_pb2.NodeInfo(
        node_id="n1",
        state="connected",
        sections=[common_pb2.SectionStatus(section="devices", state=common_pb2.CONVERGED, generation=3)],
        labels={"rack": "r1"},
    )
    doc = message_to_json(info)
    keys = list(doc)
    assert keys[:4] == ["node_id", "role", "state", "generation"]
    assert keys.index("generation") < keys.index("sections")
    assert doc["generation"] == 0 and doc["last_seen_age_ms"] == 0  # printed at their defaults, as numbers
    assert doc["sections"] == [
        {"section": "devices", "state": "CONVERGED", "generation": 3, "reason": "", "message": ""}
    ]
    assert doc["labels"] == {"rack": "r1"}
    assert "inventory" not in doc  # an unset message field has presence: absent, not {}
    json.dumps(doc)  # and it is plain JSON


def test_message_to_json_unquotes_large_int64() -> None:
    doc = message_to_json(admin_pb2.CreateTokenResponse(token="t", expires_at_ms=1_700_000_000_000))
    assert doc == {"token": "t", "token_id": "", "node_id": "", "expires_at_ms": 1_700_000_000_000}


def test_message_to_json_reservation_starts_with_its_id() -> None:
    r = admin_pb2.Reservation(id="r-1", node_id="n1", devices=[admin_pb2.BookedDevice(atom_id="gpu/0")])
    doc = message_to_json(r)
    assert next(iter(doc)) == "id"
    assert doc["devices"] == [{"device_class": "", "atom_id": "gpu/0", "gpu_uuid": ""}]
