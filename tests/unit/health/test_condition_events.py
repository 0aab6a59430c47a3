"""`node.condition` events: what changed between two stored condition lists (bc.control.nodes.status)."""

from __future__ import annotations

from bc.control.nodes.status import condition_changes


def c(t: str, status: str, reason: str, message: str = "") -> dict[str, object]:
    return {"type": t, "status": status, "reason": reason, "message": message, "since_ms": 1}


def test_appear_change_and_go_are_events_and_a_new_message_alone_is_not() -> None:
    before = [
        c("NodeReady", "True", "Ready"),
        c("GpuHealthy/G1", "True", "Healthy"),
        c("JournalFull", "False", "HasRoom"),
    ]
    after = [
        c("NodeReady", "True", "Ready", "a new message"),
        c("GpuHealthy/G1", "False", "Xid79", "XID 79: GPU has fallen off the bus"),
        c("ClockSkew", "False", "InSync"),
    ]
    got = condition_changes(before, after)
    assert [(e["type"], e["status"], e["reason"], e["before_status"], e["before_reason"]) for e in got] == [
        ("ClockSkew", "False", "InSync", "", ""),
        ("GpuHealthy/G1", "False", "Xid79", "True", "Healthy"),
        ("JournalFull", "", "Gone", "False", "HasRoom"),
    ]
    assert got[1]["message"] == "XID 79: GPU has fallen off the bus"
    assert condition_changes(after, after) == []
