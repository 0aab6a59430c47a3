"""`bc health` as an operator reads it: the limits line, the tables, and what a node reported shown escaped."""

from __future__ import annotations

import json

from bc.api.admin_roles import needed
from bc.cli.health_cmds import health_text, policy_text
from bc.protocol.pb import admin_pb2


def test_health_names_the_limits_used_and_why_each_queued_condition_waits() -> None:
    h = admin_pb2.HealthInfo(
        policy_version=3,
        enabled=True,
        limits=admin_pb2.HealthLimitsInfo(
            nodes=1, node_cap=1, actions_last_hour=2, actions_cap=4, per_label="rack", fleet_size=40
        ),
    )
    h.conditions.add(
        node_id="n1", gpu_uuid="GPU-a", reason="Xid79", message="m", since_ms=1, rule="xid:79", action="reset"
    )
    h.queue.add(
        id="h-2",
        node_id="n2",
        gpu_uuid="GPU-b",
        rule="ecc",
        action="reset",
        wait_reason="1 of at most 1 node(s) are in remediation",
    )
    text = "\n".join(health_text(h))
    assert text.splitlines()[0] == (
        "policy v3: 1 of 1 node(s) in remediation, one per rack;"
        " 2 of 4 automatic action(s) in the last hour; fleet of 40"
    )
    assert "1 of at most 1 node(s) are in remediation" in text
    assert "running: none" in text


def test_a_reason_a_node_reported_reaches_the_terminal_escaped() -> None:
    h = admin_pb2.HealthInfo()
    h.conditions.add(node_id="n1", gpu_uuid="GPU-a", reason="Xid79\x1b[2J", since_ms=1)
    text = "\n".join(health_text(h))
    assert "\x1b" not in text and "Xid79" in text


def test_the_policy_card_and_who_may_set_it() -> None:
    info = admin_pb2.HealthPolicyInfo(
        version=0, policy_json=json.dumps({"rules": [{"match": "ecc", "action": "reset"}]})
    )
    text = "\n".join(policy_text(info))
    assert "0 (the defaults: never set)" in text and "ecc" in text
    assert needed("SetHealthPolicy")[0] == "admin"
    assert needed("GetHealth")[0] == needed("GetHealthPolicy")[0] == "viewer"


def test_an_operator_may_cordon_and_return_a_gpu_a_viewer_may_not() -> None:
    assert needed("CordonGpu")[0] == needed("ReturnGpu")[0] == "operator"
    assert needed("CordonNode")[0] == "admin"  # a whole node from every tenant stays an admin's
