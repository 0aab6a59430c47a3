"""The TUI bills each class in its own unit: the node screen's USAGE block and the reservations screen's
USED column (a MIG instance or a shared slot is never a GPU-hour)."""

from __future__ import annotations

from bc.protocol.pb import admin_pb2
from tui.screens.node import render_node
from tui.screens.reservations import used_text

HOUR_MS = 3_600_000


def row(device_class: str, atom_ms: int, profile: str = "", key: str = "n1") -> admin_pb2.UsageRow:
    return admin_pb2.UsageRow(
        key=key, atom_ms=atom_ms, atom_seconds=atom_ms / 1000, device_class=device_class, profile=profile
    )


def test_the_node_screen_shows_usage_per_class_in_its_unit() -> None:
    info = admin_pb2.NodeInfo(node_id="n1", role="node", state="connected")
    hold = admin_pb2.Reservation(id="r-1", state="active", gpus=2, device_class="gpu.mig")
    usage = [row("gpu", 2 * HOUR_MS), row("gpu.mig", HOUR_MS // 2, "1g.10gb"), row("gpu.slot", 4 * HOUR_MS)]
    text = render_node(info, [hold], [], [], usage).plain
    assert "  r-1  active    2 gpu.mig  -" in text.splitlines()
    block = text.split("USAGE\n", 1)[1].split("RECENT COMMANDS", 1)[0].splitlines()
    assert [line.split() for line in block] == [
        ["gpu", "2.000", "GPU-hours"],
        ["gpu.mig", "1g.10gb", "0.500", "instance-hours", "(1g.10gb)"],
        ["gpu.slot", "4.000", "slot-hours"],
    ]
    assert "USAGE\n  none recorded\n" in render_node(info, [], [], [], []).plain


def test_the_reservations_screen_shows_each_reservations_use_in_its_class() -> None:
    assert used_text([row("gpu", 9 * HOUR_MS // 4, key="r-1")]) == "2.2 GPU·h"
    two = [row("gpu.mig", HOUR_MS // 2, "2g.20gb"), row("gpu.mig", HOUR_MS // 2, "3g.40gb")]
    assert used_text(two) == "0.5 MIG·h 2g.20gb, 0.5 MIG·h 3g.40gb"
    assert used_text([row("gpu.slot", HOUR_MS)]) == "1.0 slot·h"
    assert used_text(None) == used_text([]) != ""
