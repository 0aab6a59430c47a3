"""The role table reaches inside a call: every command kind has a role, and every job template needs the role
of its most privileged step, each step checked as the direct call with the same effect. Derived by walking
`bc.protocol.kinds.KINDS`, `bc.jobs.views.TEMPLATES` and `bc.jobs.primitives.PRIMITIVES`, never listed here."""

from __future__ import annotations

import json

import pytest

from bc.api.admin_roles import KIND_ROLE, STEP_ROLE, needed, step_needed
from bc.control.base.actor import RANK, ROLES
from bc.jobs import primitives, templates
from bc.jobs.views import TEMPLATES, JobRequest
from bc.protocol import kinds
from bc.protocol.pb import admin_pb2

RELEASE = json.dumps({"version": "1.4.0", "url": "https://h/r", "sha256": "ab" * 32, "size": 10, "sequence": 3})
ARGS: dict[str, dict[str, str]] = {
    "rollout": {"section": "telemetry", "section_json": "{}"},
    "release": {"section": "daemon", "section_json": RELEASE},
}
"""What a template needs beyond a node to build at all (the rest build from a node alone)."""

DIRECT = {"SetWanted", "Command", "Batch", "PatchSpec"}
"""Steps checked as the direct call they make; every other primitive is in `STEP_ROLE`."""


def top(*pairs: tuple[str, str]) -> str:
    return max((role for role, _ in pairs), key=RANK.__getitem__)


def test_every_command_kind_has_a_role_and_nothing_else_does() -> None:
    assert set(KIND_ROLE) == set(kinds.KINDS)
    assert set(KIND_ROLE.values()) <= set(ROLES) - {"viewer"}


@pytest.mark.parametrize("kind", sorted(kinds.KINDS))
def test_a_kind_needs_its_role_alone_fanned_out_and_in_a_batch(kind: str) -> None:
    want = top(needed("RunCommand"), (KIND_ROLE[kind], ""))
    assert needed("RunCommand", admin_pb2.RunCommandRequest(node_id="n1", kind=kind))[0] == want
    fan = admin_pb2.EnqueueCommandsRequest(
        commands=[admin_pb2.RunCommandRequest(kind="diag.nvml"), admin_pb2.RunCommandRequest(kind=kind)]
    )
    assert needed("EnqueueCommands", fan)[0] == want
    assert needed("CreateBatch", admin_pb2.CreateBatchRequest(kind=kind))[0] == top(needed("CreateBatch"), (want, ""))
    if RANK[want] > RANK[needed("RunCommand")[0]]:
        assert kind in needed("RunCommand", admin_pb2.RunCommandRequest(kind=kind))[1]  # the sentence names it


def test_every_primitive_is_checked_as_a_direct_call_or_has_a_step_role() -> None:
    assert set(primitives.PRIMITIVES) == DIRECT | set(STEP_ROLE)
    assert not DIRECT & set(STEP_ROLE)


@pytest.mark.parametrize("template", TEMPLATES)
def test_a_job_needs_the_role_of_its_most_privileged_step(template: str) -> None:
    extra = ARGS.get(template, {})
    request = admin_pb2.SubmitJobRequest(template=template, nodes=["n1"], **extra)
    facts = templates.Facts(frozenset({"n1"}), has_approvers=True, gpus={"n1": ("GPU-1",)})
    dag = templates.build(JobRequest(template=template, nodes=("n1",), **extra), "j-1", facts)
    steps = [step_needed(s) for s in dag.nodes]
    assert all(s.kind in primitives.PRIMITIVES for s in dag.nodes)
    role, what = needed("SubmitJob", request)
    assert role == top(needed("SubmitJob"), *steps), (template, steps)
    if RANK[role] > RANK[needed("SubmitJob")[0]]:
        assert what.startswith(f"running a{'n' if template[0] in 'aeiou' else ''} {template} job: ")


def test_a_cordon_step_is_admin_as_cordon_node_is_and_a_drain_job_cordons() -> None:
    assert needed("CordonNode")[0] == "admin"
    assert needed("SubmitJob", admin_pb2.SubmitJobRequest(template="drain", nodes=["n1"]))[0] == "admin"
    assert (
        needed("SubmitJob", admin_pb2.SubmitJobRequest(template="release", nodes=["n1"], **ARGS["release"]))[0]
        == (KIND_ROLE[templates.UPGRADE_KIND])
    )
