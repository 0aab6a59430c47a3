"""A rolling reboot under a quorum asks for one batch per wave of --max-parallel nodes, each when it is due."""

from __future__ import annotations

from bc.jobs.model import Dep, DepWhen
from bc.jobs.templates import Facts, build, reboot_waves
from bc.jobs.views import JobRequest

NODES = ("n1", "n2", "n3", "n4", "n5")
ANY = DepWhen.AFTER_ANY


def test_the_waves_are_max_parallel_nodes_in_the_order_given_or_all_at_once() -> None:
    assert reboot_waves(NODES, 2) == [("n1", "n2"), ("n3", "n4"), ("n5",)]
    assert reboot_waves(NODES, 0) == [NODES]
    assert reboot_waves(NODES, 9) == [NODES]


def test_each_waves_batch_comes_due_after_the_wave_before_and_releases_its_own_nodes_leaves() -> None:
    spec = build(JobRequest("reboot", NODES, max_parallel=2), "j-1", Facts(frozenset(NODES), has_approvers=True))
    by_id = {n.id: n for n in spec.nodes}
    assert [n.id for n in spec.nodes if n.kind == "Batch"] == ["batch:1", "batch:2", "batch:3"]
    assert by_id["batch:1"].deps == () and by_id["batch:1"].params["nodes"] == ["n1", "n2"]
    assert by_id["batch:2"].deps == (Dep("batch:1"), Dep("reboot:n1", ANY), Dep("reboot:n2", ANY))
    assert by_id["batch:3"].params["nodes"] == ["n5"]
    assert by_id["reboot:n3"].deps == (Dep("batch:2"),) and by_id["cmd:n3"].params["batch_node"] == "batch:2"
    resolve = by_id["resolve:2"]
    assert resolve.tail and resolve.params == {"batch_node": "batch:2"}
    assert resolve.deps == (Dep("batch:2", ANY), Dep("reboot:n3", ANY), Dep("reboot:n4", ANY))


def test_one_wave_keeps_one_batch_named_batch_and_no_approvers_no_batch() -> None:
    one = build(JobRequest("reboot", NODES), "j-1", Facts(frozenset(NODES), has_approvers=True))
    assert [n.id for n in one.nodes if n.kind in ("Batch", "ResolveApproval")] == ["batch", "resolve"]
    none = build(JobRequest("reboot", NODES, max_parallel=2), "j-1", Facts(frozenset(NODES), has_approvers=False))
    assert not [n for n in none.nodes if n.kind in ("Batch", "ResolveApproval")]
