"""The `release` job template (`bc release rollout`): daemon.upgrade node by node, at most --max-unavailable at
once, stopping on the first failure; bad input is refused before a DAG exists."""

from __future__ import annotations

import json

import pytest

from bc.errors import NotFound, UsageError
from bc.jobs import templates
from bc.jobs.views import JobRequest

FACTS = templates.Facts(nodes=frozenset({"n1", "n2", "n3"}), has_approvers=False)
PAYLOAD = json.dumps({"version": "1.4.0", "url": "https://h/r", "sha256": "ab" * 32, "size": 10, "sequence": 3})


def request(**kw: object) -> JobRequest:
    base: dict[str, object] = {
        "template": "release",
        "nodes": ("n1", "n2", "n3"),
        "section": "daemon",
        "section_json": PAYLOAD,
        "max_unavailable": 2,
    }
    return JobRequest(**{**base, **kw})  # type: ignore[arg-type]


def test_one_upgrade_command_per_node_under_the_dags_own_pool() -> None:
    dag = templates.build(request(), "j-1", FACTS)
    assert dag.stop_on_failure and dag.local_pools == {templates.ROLLOUT_POOL: 2}
    commands = [n for n in dag.nodes if n.kind == "Command"]
    assert [n.subject for n in commands] == ["n1", "n2", "n3"]
    for n in commands:
        assert n.params == {"kind": "daemon.upgrade", "payload_json": PAYLOAD}
        assert n.lease and n.pools == (templates.ROLLOUT_POOL,)
    assert sum(n.kind == "Emit" and n.tail for n in dag.nodes) == 3


@pytest.mark.parametrize(
    ("kw", "error", "match"),
    [
        ({"nodes": ("n1", "nope")}, NotFound, "no node named 'nope'"),
        ({"section": "host"}, UsageError, "needs the daemon section's release"),
        ({"section_json": '{"version": "1.4.0", "bogus": 1}'}, UsageError, "not a valid DaemonUpgradeRequest"),
        ({"max_unavailable": 0}, UsageError, "--max-unavailable must be at least 1"),
    ],
)
def test_bad_input(kw: dict[str, object], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        templates.build(request(**kw), "j-1", FACTS)
