"""Who may read a secret (bc.control.secrets.scope) and which secrets a spec names (bc.protocol.secret_refs)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bc.control.secrets.scope import Scope, admits, parse
from bc.errors import UsageError
from bc.protocol import secret_refs
from bc.protocol.pb import spec_pb2

KEYS = st.sampled_from(["pool", "zone", "bc.dev/rack"])
VALUES = st.sampled_from(["a", "b", ""])
NODES = st.sampled_from(["n1", "n2", "n3"])


@given(
    node=NODES,
    labels=st.dictionaries(KEYS, VALUES, max_size=3),
    scope_nodes=st.lists(NODES, max_size=2),
    selectors=st.lists(st.tuples(KEYS, st.one_of(st.none(), VALUES)), max_size=3),
)
def test_a_node_is_admitted_by_its_id_or_one_matching_selector(
    node: str,
    labels: dict[str, str],
    scope_nodes: list[str],
    selectors: list[tuple[str, str | None]],
) -> None:
    texts = [k if v is None else f"{k}={v}" for k, v in selectors]
    scope = Scope(tuple(scope_nodes), tuple(texts))
    expected = node in scope_nodes or any(k in labels and (v is None or labels[k] == v) for k, v in selectors)
    assert admits(scope, node, labels) is expected
    assert not admits(Scope(), node, labels)  # an empty scope admits nobody


def test_a_scope_is_checked_before_it_is_stored() -> None:
    assert parse(["n2", "n1", "n1"], ["pool=a"]) == Scope(("n1", "n2"), ("pool=a",))
    for nodes, labels in ((["N 1"], []), (["n\x1b1"], []), ([], ["=a"]), ([], ["pool=a b"])):
        with pytest.raises(UsageError):
            parse(nodes, labels)


def test_the_spec_names_its_secrets_by_section() -> None:
    spec = spec_pb2.NodeSpec(telemetry=spec_pb2.TelemetrySection(otlp_endpoint="http://c:4317", headers_secret_ref="h"))
    assert [r.where for r in secret_refs.refs(spec)] == ["telemetry"]
    assert secret_refs.names(spec, "telemetry") == {"h"}
    assert secret_refs.names(spec, "host") == set()
    assert secret_refs.refs(spec_pb2.NodeSpec()) == []


def test_instances_name_their_user_data_once_per_secret() -> None:
    named = (("a", "ud"), ("b", "ud"), ("c", ""), ("d", "u2"))
    vms = [spec_pb2.Instance(id=i, user_data_secret_ref=r) for i, r in named]
    spec = spec_pb2.NodeSpec(instances=spec_pb2.InstancesSection(instances=vms))
    assert [(r.where, r.name) for r in secret_refs.refs(spec)] == [("instances", "u2"), ("instances", "ud")]
    assert secret_refs.names(spec, "instances") == {"ud", "u2"}
    spec.instances.instances[3].allocation_id = "al-1"
    assert secret_refs.allocation_names(spec, "instances", "al-1") == {"u2"}
    assert secret_refs.allocation_names(spec, "instances", "al-2") == set()
    assert secret_refs.allocation_names(spec, "telemetry", "al-1") == set()


@given(st.text(max_size=40))
def test_a_name_is_the_rule_or_one_sentence(name: str) -> None:
    try:
        assert secret_refs.check_name(name) == name
    except UsageError as e:
        assert "bad secret name" in e.message and "\n" not in e.message.replace(repr(name), "")
