"""The health policy's format (`bc.control.health.policy`) and the conditions it reads (`.conditions`)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bc.control.health import conditions as c
from bc.control.health import policy as p
from bc.errors import UsageError


def test_an_empty_object_is_the_defaults_and_a_policy_survives_its_own_text() -> None:
    assert p.parse("{}") == p.DEFAULT
    custom = p.parse(
        json.dumps(
            {
                "drain": "ask",
                "rules": [
                    {"match": "ecc", "at_least": 8, "action": "reset"},
                    {"match": "xid:*", "action": "quarantine"},
                ],
                "limits": {"max_nodes": 3, "max_fleet_percent": 50, "per_label": "rack", "max_actions_per_hour": 2},
            }
        )
    )
    assert p.parse(custom.text()) == custom
    assert custom.action_for({"ecc": 7}) == ("none", "")
    assert custom.action_for({"ecc": 8}) == ("reset", "ecc")
    assert custom.action_for({"xid:13": 1}) == ("quarantine", "xid:*")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[]", "the health policy must be a JSON object"),
        ("{", "the health policy is not JSON"),
        ('{"drian": "wait"}', "the health policy has an unknown key 'drian'"),
        ('{"drain": "release"}', 'drain must be one of wait, ask, not "release"'),
        ('{"limits": {"max_nodes": 0}}', "limits.max_nodes must be a whole number from 1 to 10,000, not 0"),
        ('{"limits": {"max_fleet_percent": 101}}', "limits.max_fleet_percent must be a whole number from 1 to 100"),
        ('{"limits": {"per_label": "a b"}}', "limits.per_label must be a label key"),
        ('{"rules": [{"match": "xid:abc", "action": "reset"}]}', "rule 1: match must be xid:N"),
        ('{"rules": [{"match": "ecc"}]}', "rule 1 needs both match and action"),
        ('{"rules": [{"match": "offbus", "action": "reset", "at_least": 2}]}', "rule 1: at_least counts ECC errors"),
        ('{"enabled": "yes"}', "enabled must be true or false"),
        ('{"flap_window_s": 1.5}', "flap_window_s must be a whole number"),
    ],
)
def test_a_bad_policy_is_one_sentence_naming_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(UsageError) as e:
        p.parse(text)
    assert e.value.message.startswith(message)
    assert "\n" not in e.value.message


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=8),
        lambda x: st.lists(x) | st.dictionaries(st.text(max_size=8), x),
        max_leaves=20,
    )
)
def test_any_json_parses_or_is_refused_in_one_line(doc: object) -> None:
    try:
        policy = p.parse(json.dumps(doc))
    except UsageError as e:
        assert "\n" not in e.message
    else:
        assert p.parse(policy.text()) == policy


def test_the_fleet_cap_is_the_smaller_limit_but_never_below_one_node() -> None:
    lim = p.Limits(max_nodes=5, max_fleet_percent=10)
    assert [lim.fleet_cap(n) for n in (1, 9, 10, 30, 100)] == [1, 1, 1, 3, 5]


def test_signals_read_every_problem_the_agent_lists() -> None:
    message = (
        "XID 79: GPU has fallen off the bus; 12 uncorrectable volatile ECC errors;"
        " a row remap is pending until the GPU is reset"
    )
    assert c.signals_of("Xid79", message) == {"xid:79": 1, "ecc": 12, "remap-pending": 1}
    assert c.signals_of("Xid48", "") == {"xid:48": 1}
    assert c.signals_of("SomethingNew", "words") == {"other": 1}


def test_only_false_gpu_conditions_are_sick_gpus() -> None:
    status = {
        "conditions": [
            {"type": "GpuHealthy/GPU-b", "status": "False", "reason": "Xid79", "message": "XID 79: x", "since_ms": 5},
            {"type": "GpuHealthy/GPU-a", "status": "True", "reason": "Healthy"},
            {"type": "NodeReady", "status": "False", "reason": "JournalFull"},
        ]
    }
    (only,) = c.from_status("n1", json.dumps(status))
    assert (only.key, only.since_ms, dict(only.signals)) == (("n1", "GPU-b"), 5, {"xid:79": 1})
    assert c.from_status("n1", "not json") == []
