"""The host units' pure rules: what settings are refused, what a drop-in says, the MIG layout rule."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.converge.host_ops import PathOutsideRoot, rel_path
from agent.converge.host_units.hugepages import pool_file
from agent.converge.host_units.mig import commands
from agent.converge.host_units.sysctl import render
from agent.hw.fake_mig import FakeMig
from agent.hw.mig_profiles import layout_problem, profiles_for
from bc.protocol.host_units import UnitInvalid, parse_layouts, parse_pools, parse_values, size_kb

NAME = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-", min_size=1, max_size=12)
KEY = st.lists(NAME, min_size=1, max_size=5).map(".".join)
VALUE = st.one_of(st.integers(min_value=-(2**40), max_value=2**40), st.text(alphabet="abc 0123456789:", min_size=1))


@given(st.dictionaries(KEY, VALUE, min_size=1, max_size=8))
def test_valid_sysctl_settings_render_one_line_per_key(values: dict[str, object]) -> None:
    try:
        parsed = parse_values(values)
    except UnitInvalid:
        assert any(isinstance(v, str) and not v.strip() for v in values.values())
        return
    lines = render(parsed).decode().splitlines()
    assert lines[0].startswith("# Written by bc")
    assert [line.split(" = ", 1)[0] for line in lines[1:]] == sorted(values)


@given(KEY, KEY, st.sampled_from(["/", "..", "/../"]))
def test_a_sysctl_key_with_a_slash_or_dot_dot_is_refused(a: str, b: str, sep: str) -> None:
    with pytest.raises(UnitInvalid, match=re.escape("has a '/' or '..'")):
        parse_values({f"{a}{sep}{b}": 1})


@given(KEY, st.text(max_size=5), st.sampled_from(["\n", "\r", "\0", "#"]), st.text(max_size=5))
def test_a_sysctl_value_that_could_add_a_line_is_refused(key: str, a: str, bad: str, b: str) -> None:
    with pytest.raises(UnitInvalid):
        parse_values({key: f"1{a}{bad}{b}"})


@pytest.mark.parametrize(("text", "kb"), [("2M", 2048), ("1G", 1048576), ("2048kB", 2048), ("64K", 64)])
def test_huge_page_sizes(text: str, kb: int) -> None:
    assert size_kb(text) == kb


@pytest.mark.parametrize(
    "pages",
    [
        [{"size": "2MB", "count": 1}],
        [{"size": "2M", "count": -1}],
        [{"size": "2M", "count": True}],
        [{"size": "2M", "count": 1}, {"size": "2M", "count": 2}],
        [{"size": "2M", "count": 1}, {"size": "2M", "count": 2, "numa_node": 0}],
        [{"size": "2M", "count": 1, "node": 0}],
    ],
)
def test_bad_huge_page_settings_are_refused(pages: list[dict[str, object]]) -> None:
    with pytest.raises(UnitInvalid):
        parse_pools({"pages": pages})


def test_pool_files() -> None:
    assert pool_file((2048, None)) == "sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"
    assert pool_file((1048576, 1)) == "sys/devices/system/node/node1/hugepages/hugepages-1048576kB/nr_hugepages"


A100 = "NVIDIA A100-SXM4-80GB"
PROFILES = sorted(profiles_for(A100))


@given(st.lists(st.sampled_from([*PROFILES, "5g.50gb"]), max_size=8))
def test_the_fake_makes_exactly_the_layouts_the_rule_allows(layout: list[str]) -> None:
    fake = FakeMig("s", "p", {"gpus": [{"name": A100, "mig_enabled": True}]})
    problem = layout_problem(A100, layout)
    results = [fake.handle(argv) for argv in commands(0, True, layout, True)]
    assert all(r.returncode == 0 for r in results[:-1])
    if layout:
        assert (results[-1].returncode == 0) == (problem is None), (layout, problem, results[-1])
    made = [(g["gi"], g["profile"]) for g in fake.gpus[0].gis]
    assert [p for _, p in made] == (layout if problem is None else [])
    assert len({gi for gi, _ in made}) == len(made)


def test_a_gpu_without_mig_offers_no_layout() -> None:
    assert layout_problem("NVIDIA L4", ["1g.10gb"]) == "NVIDIA L4 does not support MIG"


@pytest.mark.parametrize(
    "gpus",
    [
        [{"gpu": 0, "instances": ["3g.40gb"], "enabled": False}],
        [{"gpu": 0}, {"gpu": 0}],
        [{"gpu": True}],
        [{"gpu": "0"}],
        [{"gpu": 0, "instances": ["3g.40gb; reboot"]}],
        [{"gpu": 0, "profile": "x"}],
    ],
)
def test_bad_mig_settings_are_refused(gpus: list[dict[str, object]]) -> None:
    with pytest.raises(UnitInvalid):
        parse_layouts({"gpus": gpus})


@given(st.lists(st.sampled_from(["a", "b", "..", ".", "", "/"]), min_size=1, max_size=5))
def test_a_relative_path_never_leaves_the_root(parts: list[str]) -> None:
    rel = "/".join(parts)
    try:
        p = rel_path(rel)
    except PathOutsideRoot:
        return
    assert all(part in ("a", "b") for part in p.parts)
