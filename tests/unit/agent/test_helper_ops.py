"""agent.helper.ops: what the root helper agrees to do, checked before anything is touched.

Each operation's examples show the table's rule; the Hypothesis properties
show that no request, however built, plans an effect outside the helper's
root, names a path it took from the request, or escapes as anything but
`Refused`.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.converge import env_files
from agent.converge.host_units.gpu_sharing import mps_unit
from agent.helper import ops, update_ops
from agent.helper.ops import (
    FollowKmsg,
    Layout,
    Refused,
    Remove,
    Run,
    TpmCall,
    UpdateInstall,
    UpdateRemember,
    UpdateStage,
    UpdateStep,
    Write,
    WriteInPlace,
)
from agent.hw import cdi
from agent.tpm import HANDLES
from bc.pki import releases
from bc.protocol.atoms import parse_atom
from bc.protocol.root_equiv import sysctl_key_problem

ROOT = Path("/h")
LAY = Layout(ROOT)


def req(op: str, **args: Any) -> dict[str, Any]:
    return {"v": ops.VERSION, "op": op, **args}


def spec(aid: str = "a1") -> str:
    dev = cdi.ResolvedDevice(parse_atom("gpu", "GPU-1"), "GPU-1", 0)
    doc = cdi.render_spec(aid, "r1", [dev], cdi.env_lines(aid, [dev], kubernetes=False), kubernetes=False)
    return cdi.spec_bytes(doc).decode()


def refused(request: Any, match: str = ".") -> str:
    with pytest.raises(Refused, match=match) as e:
        ops.plan(request, LAY)
    return str(e.value)


# -- hold files


def test_a_holds_cdi_spec_lands_at_the_path_the_helper_builds_from_the_id() -> None:
    (w,) = ops.plan(req("file.write", kind="cdi", allocation_id="a1", data=spec()), LAY)
    assert w == Write(ROOT / "etc/cdi/bc-a1.json", spec().encode())


def test_an_env_file_needs_its_allocations_marker() -> None:
    good = env_files.env_bytes("a1", ["NVIDIA_VISIBLE_DEVICES=GPU-1"]).decode()
    (w,) = ops.plan(req("file.write", kind="allocation-env", allocation_id="a1", data=good), LAY)
    assert isinstance(w, Write) and w.path == ROOT / "run/bc/allocations/bc-a1.env"
    refused(req("file.write", kind="allocation-env", allocation_id="a2", data=good), "marker")
    refused(req("file.write", kind="allocation-env", allocation_id="a1", data=good + "not a line\n"), "KEY=VALUE")


@pytest.mark.parametrize("aid", ["../etc/shadow", "/etc/passwd", ".hidden", "a/b", "", "a" * 200])
def test_an_allocation_id_that_is_not_one_is_refused(aid: str) -> None:
    refused(req("file.remove", kind="cdi", allocation_id=aid), "allocation id")


def test_a_request_naming_a_path_is_refused() -> None:
    refused(req("file.write", kind="cdi", allocation_id="a1", data=spec(), path="/etc/shadow"), "takes no path")
    refused(req("file.remove", kind="/etc/shadow", allocation_id="a1"), "kind")


def test_a_cdi_spec_of_another_allocation_or_with_a_hook_or_a_foreign_node_is_refused() -> None:
    refused(req("file.write", kind="cdi", allocation_id="a2", data=spec("a1")), "not allocation a2's")
    doc = json.loads(spec())
    doc["containerEdits"]["hooks"] = [{"hookName": "createRuntime", "path": "/bin/sh"}]
    refused(req("file.write", kind="cdi", allocation_id="a1", data=json.dumps(doc)), "hooks")
    doc = json.loads(spec())
    doc["devices"][0]["containerEdits"]["deviceNodes"] = [{"path": "/dev/sda"}]
    refused(req("file.write", kind="cdi", allocation_id="a1", data=json.dumps(doc)), "/dev/sda")
    refused(req("file.write", kind="cdi", allocation_id="a1", data="{not json"), "does not validate")


# -- slices


def test_a_holds_slice_is_applied_with_properties_the_helper_builds() -> None:
    limits = {"cpu_millis": 2000, "memory_bytes": 1 << 30, "cpus": "0-3", "hugepages_1gi": 1}
    p = ops.plan(req("slice.apply", slice="bc-alloc-a1.slice", limits=limits), LAY)
    assert p[0] == Run(
        (
            "systemctl",
            "set-property",
            "--runtime",
            "bc-alloc-a1.slice",
            "MemoryAccounting=yes",
            "CPUQuota=200%",
            f"MemoryMax={1 << 30}",
            f"MemoryHigh={(1 << 30) * 9 // 10}",
            "AllowedCPUs=0-3",
        )
    )
    assert p[1] == Run(("systemctl", "start", "bc-alloc-a1.slice"))
    assert p[-1] == WriteInPlace(
        ROOT / "sys/fs/cgroup/bc.slice/bc-alloc.slice/bc-alloc-a1.slice/hugetlb.1GB.max", str(1 << 30)
    )


@pytest.mark.parametrize(
    "name", ["sshd.service", "system.slice", "bc-alloc-.slice", "bc-alloc-a1.service", "bc-alloc-../x.slice"]
)
def test_a_slice_that_is_not_a_holds_is_refused(name: str) -> None:
    refused(req("slice.remove", slice=name), "not a hold's slice")


def test_a_slice_named_for_a_real_allocation_id_nests_where_systemd_puts_it() -> None:
    # Allocation ids are `alloc-<hex>` (bc.seams.ids.short_id): each `-` is a level of the cgroup tree.
    p = ops.plan(req("slice.apply", slice="bc-alloc-alloc-3f9a0c1b2d4e.slice", limits={"hugepages_2mi": 2}), LAY)
    assert p[1] == Run(("systemctl", "start", "bc-alloc-alloc-3f9a0c1b2d4e.slice"))
    leaf = "sys/fs/cgroup/bc.slice/bc-alloc.slice/bc-alloc-alloc.slice/bc-alloc-alloc-3f9a0c1b2d4e.slice"
    assert p[-1] == WriteInPlace(ROOT / leaf / "hugetlb.2MB.max", str(4 << 20))


@pytest.mark.parametrize(
    "limits", [{"cpus": "0-3; rm -rf /"}, {"memory_bytes": -1}, {"memory_bytes": "1G"}, {"CPUQuota": "1%"}, []]
)
def test_limits_that_are_not_sizes_and_cpulists_are_refused(limits: Any) -> None:
    refused(req("slice.apply", slice="bc-alloc-a1.slice", limits=limits))


# -- host units


def test_a_sysctl_drop_in_within_the_allowlist_is_written_and_loaded_from_the_helpers_path() -> None:
    text = "# header\nvm.swappiness = 10\nnet.core.somaxconn = 4096\n"
    (w,) = ops.plan(req("host.file.write", file="sysctl", data=text), LAY)
    assert w == Write(ROOT / "etc/sysctl.d/90-bc-sysctl.conf", text.encode())
    assert ops.plan(req("host.run", argv=["sysctl", "-p"]), LAY) == (
        Run(("sysctl", "-p", str(ROOT / "etc/sysctl.d/90-bc-sysctl.conf"))),
    )


@pytest.mark.parametrize(
    "line", ["kernel.modprobe = /tmp/x", "kernel.core_pattern = |/tmp/x", "kernel.sysrq = 1", "dev.foo = 1"]
)
def test_a_sysctl_outside_the_allowlist_is_refused(line: str) -> None:
    refused(req("host.file.write", file="sysctl", data=line + "\n"), "keys an operator may")


def test_a_units_file_is_accepted_only_as_bc_renders_it() -> None:
    ops.plan(req("host.file.write", file="gpu-sharing.mps", data=mps_unit(25).decode()), LAY)
    evil = mps_unit(25).decode().replace("/usr/bin/nvidia-cuda-mps-control -d", "/bin/sh -c id")
    refused(req("host.file.write", file="gpu-sharing.mps", data=evil), "not one bc renders")
    refused(req("host.file.write", file="etc/passwd", data="x"), "not one of")


@pytest.mark.parametrize(
    "argv",
    [
        ["sysctl", "-w", "kernel.modprobe=/tmp/x"],
        ["modprobe", "-r", "nvidia"],
        ["sh", "-c", "id"],
        ["systemctl", "restart", "sshd.service"],
        ["nvidia-smi", "-i", "0", "-mig", "1", "--extra"],
        ["sysctl", "-p", "/tmp/evil.conf"],
    ],
)
def test_a_command_outside_the_host_units_table_is_refused(argv: list[str]) -> None:
    refused(req("host.run", argv=argv), "not one the host units run")


def test_host_unit_commands_in_the_table_pass_as_they_are() -> None:
    for argv in (
        ["modprobe", "vfio_pci"],
        ["nvidia-smi", "mig", "-i", "0", "-cgi", "3g.40gb,2g.20gb", "-C"],
        ["systemctl", "disable", "--now", "bc-nvidia-mps.service"],
    ):
        assert ops.plan(req("host.run", argv=argv), LAY) == (Run(tuple(argv)),)


def test_huge_pages_are_set_on_the_pool_the_helper_names() -> None:
    (w,) = ops.plan(req("host.hugepages", size_kb=2048, node=1, count=64), LAY)
    assert w == WriteInPlace(ROOT / "sys/devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages", "64")
    refused(req("host.hugepages", size_kb="2048/../../x", node=None, count=1), "size_kb")


# -- sshd, resets, reboots, the envelope


def test_sshd_files_are_line_checked_and_the_dropin_names_only_the_helpers_files() -> None:
    d = LAY.ssh_dir
    dropin = (
        f"# h\nTrustedUserCAKeys {d}/ca.pub\nAuthorizedPrincipalsFile {d}/principals/%u\nRevokedKeys {d}/revoked.krl\n"
    )
    (w,) = ops.plan(req("sshd.write", file="dropin", data=dropin), LAY)
    assert isinstance(w, Write) and w.path == d / "sshd.conf"
    refused(req("sshd.write", file="dropin", data=dropin + "PermitRootLogin yes\n"), "drop-in")
    refused(req("sshd.write", file="ca", data="ssh-ed25519 AAAA x\nPermitRootLogin yes\n"))
    refused(req("sshd.write", file="principals", user="../../root", data="oncall\n"))
    assert ops.plan(req("sshd.remove", file="principals", user="oncall"), LAY) == (Remove(d / "principals/oncall"),)
    assert ops.plan(req("sshd.reload"), LAY)[0].argv[:2] == ("sshd", "-t")  # type: ignore[union-attr]


def test_a_gpu_reset_names_a_gpu_uuid_and_a_reboot_takes_nothing() -> None:
    assert ops.plan(req("gpu.reset", uuid="GPU-0123abcd-00"), LAY) == (
        Run(("nvidia-smi", "--gpu-reset", "-i", "GPU-0123abcd-00")),
    )
    refused(req("gpu.reset", uuid="-i 0; reboot"), "GPU UUID")
    refused(req("node.reboot", when="now"), "takes no when")


def test_an_operation_outside_the_table_or_another_version_is_refused() -> None:
    refused(req("file.read", kind="cdi", allocation_id="a1"), "not in the helper's table")
    refused({"v": 0, "op": "helper.hello"}, "restart bc node and bc helper together")
    refused([1, 2], "JSON object")


# -- properties

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=6,
)
HOLD_ARGS = ["kind", "allocation_id", "data", "slice", "limits", "file", "user", "argv", "uuid", "size_kb", "node"]
UPDATE_ARGS = ["offset", "step", "command_id", "deadline", "refused", "after_seq", "path", "install_dir", "root"]
RELEASE_ARGS = ["name", "version", "sequence", "platform", "sha256", "size", "signature", "keys", "running_version"]
TPM_ARGS = ["slot", "digest", "credential", "secret", "handle", "tcti"]
arg_names = st.sampled_from([*HOLD_ARGS, "count", *UPDATE_ARGS, *RELEASE_ARGS, *TPM_ARGS])
requests = st.fixed_dictionaries(
    {"v": st.just(ops.VERSION), "op": st.sampled_from([*ops.TABLE, "file.read", ""])},
    optional={},
).flatmap(lambda base: st.dictionaries(arg_names, json_values, max_size=5).map(lambda args: {**args, **base}))


def _within_root(path: Path) -> bool:
    return ".." not in path.parts and path.is_relative_to(ROOT)


@given(requests)
@settings(max_examples=400, deadline=None)
def test_any_request_is_refused_or_plans_effects_only_under_the_root(request: dict[str, Any]) -> None:
    try:
        plan = ops.plan(request, LAY)
    except Refused as e:
        assert str(e) and "\n" not in str(e)[:200]
        return
    for effect in plan:
        if isinstance(effect, (Write, WriteInPlace, Remove)):
            assert _within_root(effect.path), effect
        if isinstance(effect, (UpdateStage, UpdateInstall, UpdateStep, UpdateRemember)):
            assert effect.path == LAY.install_dir, effect  # the slot's file names are fixed (agent.upgrade.slots)
        if isinstance(effect, UpdateInstall):
            assert effect.roots == LAY.release_roots  # root's list: never a file the request names
        if isinstance(effect, FollowKmsg):
            assert effect.path == LAY.kmsg
        if isinstance(effect, Run):
            assert effect.argv[0] in {"systemctl", "sysctl", "modprobe", "nvidia-smi", "sshd"}
        if isinstance(effect, TpmCall):  # a handle of the helper's own range, or none; blobs bounded
            assert effect.handle in (0, *HANDLES) and len(effect.digest) in (0, 32), effect
            assert len(effect.credential) <= 134 and len(effect.secret) <= 514, effect


@given(st.text(max_size=80))
@settings(max_examples=800, deadline=None)
def test_no_allocation_id_builds_a_path_outside_its_directory(aid: str) -> None:
    for kind, directory in (("cdi", LAY.cdi_dir), ("allocation-env", LAY.env_dir)):
        try:
            (effect,) = ops.plan(req("file.remove", kind=kind, allocation_id=aid), LAY)
        except Refused:
            continue
        assert isinstance(effect, Remove) and effect.path.parent == directory


@given(st.lists(st.text(max_size=20), max_size=8))
@settings(max_examples=800, deadline=None)
def test_any_argv_is_refused_or_a_table_command(argv: list[str]) -> None:
    try:
        (effect,) = ops.plan(req("host.run", argv=argv), LAY)
    except Refused:
        return
    assert isinstance(effect, Run) and not any(a.startswith("/") for a in argv)


# -- each operation's validation, fuzzed with arguments of the right shape

sysctl_keys = st.from_regex(r"(kernel|vm|net|fs|dev|user)\.[a-z_.]{1,20}", fullmatch=True)
sysctl_values = st.text(alphabet=st.characters(codec="ascii", exclude_categories=("Cc",)), min_size=1, max_size=12)


@given(st.dictionaries(sysctl_keys, sysctl_values, max_size=4))
@settings(max_examples=600, deadline=None)
def test_a_sysctl_drop_in_is_written_only_when_every_key_is_an_operators(values: dict[str, str]) -> None:
    text = "".join(f"{k} = {v}\n" for k, v in values.items())
    try:
        (w,) = ops.plan(req("host.file.write", file="sysctl", data=text), LAY)
    except Refused:
        return
    assert isinstance(w, Write) and w.path == ROOT / "etc/sysctl.d/90-bc-sysctl.conf"
    assert all(sysctl_key_problem(k, v.strip()) is None for k, v in values.items())


limit_values = st.one_of(st.integers(-5, 1 << 52), st.text(max_size=12), st.none(), st.booleans())


@given(st.dictionaries(st.sampled_from([*ops.LIMIT_KEYS, "Delegate", "ExecStart"]), limit_values, max_size=6))
@settings(max_examples=800, deadline=None)
def test_slice_limits_become_only_properties_of_one_token_each(limits: dict[str, Any]) -> None:
    try:
        plan = ops.plan(req("slice.apply", slice="bc-alloc-alloc-1f.slice", limits=limits), LAY)
    except Refused:
        return
    set_property = plan[0]
    assert isinstance(set_property, Run)
    for prop in set_property.argv[4:]:
        key, _, value = prop.partition("=")
        assert key in {"MemoryAccounting", "CPUQuota", "MemoryMax", "MemoryHigh", "AllowedCPUs", "AllowedMemoryNodes"}
        assert value and not any(c.isspace() for c in value)


@given(st.text(max_size=40))
@settings(max_examples=600, deadline=None)
def test_a_principals_file_is_only_ever_a_file_of_the_principals_dir(user: str) -> None:
    try:
        (effect,) = ops.plan(req("sshd.remove", file="principals", user=user), LAY)
    except Refused:
        return
    assert isinstance(effect, Remove) and effect.path.parent == LAY.ssh_dir / "principals"


edit_keys = st.sampled_from(["env", "deviceNodes", "hooks", "mounts", "additionalGIDs", "intelRdt"])


@given(st.lists(edit_keys, unique=True, max_size=3))
@settings(max_examples=200, deadline=None)
def test_a_cdi_spec_passes_only_with_env_and_device_nodes_edits(keys: list[str]) -> None:
    doc = json.loads(spec())
    for k in keys:
        doc["containerEdits"].setdefault(k, [] if k != "intelRdt" else {})
    try:
        ops.plan(req("file.write", kind="cdi", allocation_id="a1", data=json.dumps(doc)), LAY)
    except Refused:
        assert set(keys) - {"env", "deviceNodes"}
        return
    assert set(keys) <= {"env", "deviceNodes"}


# -- the update and kmsg operations, fuzzed with arguments of the right shape

step_args = st.fixed_dictionaries(
    {"step": st.sampled_from([*update_ops.STEPS, "stage", "place", "restart", "../arm", ""])},
    optional={
        "command_id": st.text(max_size=20) | st.integers(),
        "deadline": st.floats(allow_nan=True) | st.integers(-5, 1 << 50) | st.booleans() | st.none(),
    },
)


@given(step_args)
@settings(max_examples=600, deadline=None)
def test_a_swap_step_is_one_of_the_machines_with_an_id_and_deadline_only_for_arm(args: dict[str, Any]) -> None:
    try:
        (effect,) = ops.plan(req("update.step", **args), LAY)
    except Refused:
        return
    assert isinstance(effect, UpdateStep) and effect.path == LAY.install_dir
    assert effect.step.value == args["step"] and effect.step.value in update_ops.STEPS
    if effect.step.value != "arm":
        assert (effect.command_id, effect.deadline) == ("", 0.0) and not {"command_id", "deadline"} & set(args)
    else:
        assert re.fullmatch(r"[A-Za-z0-9._:-]{0,128}", effect.command_id) and 0 <= effect.deadline <= 1 << 41


@given(st.integers(-3, releases.MAX_SIZE + 3), st.binary(max_size=64) | st.text(max_size=64).map(str.encode))
@settings(max_examples=400, deadline=None)
def test_a_staged_chunk_is_bytes_within_a_releases_size_at_a_fixed_path(offset: int, raw: bytes) -> None:
    try:
        (effect,) = ops.plan(req("update.stage", offset=offset, data=base64.b64encode(raw).decode()), LAY)
    except Refused:
        assert not 0 <= offset <= releases.MAX_SIZE - len(raw)
        return
    assert effect == UpdateStage(LAY.install_dir, offset, raw)


@given(json_values, st.integers(-5, 1 << 64))
@settings(max_examples=400, deadline=None)
def test_a_remembered_refusal_or_a_follow_takes_only_their_shapes(refused: Any, after_seq: int) -> None:
    try:
        (effect,) = ops.plan(req("update.remember", refused=refused), LAY)
        assert isinstance(effect, UpdateRemember) and effect.path == LAY.install_dir
        assert effect.refused is None or "\n" not in effect.refused.message
    except Refused:
        pass
    try:
        (follow,) = ops.plan(req("kmsg.follow", after_seq=after_seq), LAY)
    except Refused:
        assert not -1 <= after_seq <= (1 << 63) - 1
        return
    assert follow == FollowKmsg(LAY.kmsg, after_seq)
