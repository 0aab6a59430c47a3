"""A host section's unit settings are checked when the section is written, before anything is stored."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bc.protocol.canonical import SpecError, section_from_json
from bc.protocol.host_units import PARSERS, UnitInvalid
from bc.protocol.spec_validation import check_section


def check(units: dict[str, object]) -> None:
    doc = {"units": [{"name": k, "settings_json": json.dumps(v)} for k, v in units.items()]}
    check_section("host", section_from_json("host", json.dumps(doc)))


@pytest.mark.parametrize(
    ("units", "why"),
    [
        (
            {"sysctl": {"net/ipv4/ip_forward": 1}},
            "units[0].settings_json is refused (sysctl: key 'net/ipv4/ip_forward'",
        ),
        ({"sysctl": {"kernel..panic": 1}}, "has a '/' or '..'"),
        ({"sysctl": {"vm.swappiness": "1 # 2"}}, "line break, NUL or '#'"),
        ({"kernel-modules": {"modules": ["a b"]}}, "is not a module name"),
        ({"hugepages": {"pages": [{"size": "2MB", "count": 1}]}}, "is not like 2M, 1G or 2048kB"),
        ({"mig": {"gpus": [{"gpu": 0, "instances": ["3g.40gb;x"]}]}}, "is not a MIG profile name"),
        ({"gpu-sharing": {"mode": "magic"}}, "mode must be time-slicing or mps"),
    ],
)
def test_settings_bad_on_every_host_are_refused_with_the_unit_named(units: dict[str, object], why: str) -> None:
    with pytest.raises(SpecError) as e:
        check(units)
    assert e.value.args[0].startswith("the host section's units[0].settings_json is refused (")
    assert why in e.value.args[0], e.value.args[0]


def test_what_only_the_host_can_judge_and_unknown_units_pass() -> None:
    check(
        {
            "hugepages": {"pages": [{"size": "3M", "count": 1}]},  # a size some host may offer
            "mig": {"gpus": [{"gpu": 9, "instances": ["5g.50gb"]}]},  # a GPU and profile some host may have
            "chrony": {"anything": ["goes"]},  # the agent answers it UNSUPPORTED
            "sysctl": {},
        }
    )


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
FIELDS = st.sampled_from(["modules", "pages", "gpus", "mode", "replicas", "active_thread_percentage", "vm.x"])


@given(st.sampled_from(sorted(PARSERS)), st.dictionaries(FIELDS | st.text(max_size=6), JSON, max_size=4))
def test_any_json_object_parses_or_is_refused_with_unit_invalid(unit: str, settings: dict[str, Any]) -> None:
    try:
        PARSERS[unit](settings)
    except UnitInvalid as e:
        assert str(e).startswith(f"{unit}: ")
