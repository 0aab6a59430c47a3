"""The helper's operation table: a request in, a plan of effects out, or `Refused`. Pure, no I/O.

A request is a JSON object `{"op": NAME, ...arguments}`. `plan(request,
layout)` looks NAME up in `TABLE` and checks every argument before anything
is touched; a name outside the table, an argument it does not know, a
missing or ill-typed one, an id outside its alphabet or content the agent
would never write is refused with one sentence. Paths are never taken from a
request: the helper builds each from an id or a table key under its own
`Layout` (its root), so no request can name `/etc/shadow`.

    op                  arguments                         effects (as root)
    file.write          kind (cdi|allocation-env),        write <cdi>/bc-<id>.json (a CDI spec with no hooks or
                        allocation_id, data               mounts, /dev/nvidia* nodes only) or <env>/bc-<id>.env
    file.remove         kind, allocation_id               remove that file
    slice.apply         slice (bc-alloc-<id>.slice),      systemctl set-property --runtime, start; hugetlb limits
                        limits (sizes, cpulists)
    slice.remove        slice                             systemctl stop, revert
    host.file.write     file (HOST_FILES key), data       the unit's drop-in, content checked per key (sysctl keys
                                                          on the operator allowlist, module names, our own units)
    host.file.remove    file                              remove it
    host.hugepages      size_kb, node (int|null), count   write nr_hugepages of that pool
    host.run            argv (matching HOST_COMMANDS)     that command; `sysctl -p` gets the drop-in's path here
    host.package        manager, action, unit, branch,    the GPU node units' packages (agent.helper.gpu_ops)
                        version
    host.runtime.config runtime, present                  bc's CDI keys in a container runtime's config (gpu_ops)
    host.kubeadm.join   api_server, token, ca_cert_hashes, a join of a cluster root listed (gpu_ops)
                        labels
    sshd.write          file (ca|krl|krl-src|dropin|      the file under <ssh>, 0644; content line-checked
                        principals), user?, data
    sshd.remove         file, user?                       remove it
    sshd.check          -                                 sshd -t of the host's sshd_config
    sshd.reload         -                                 sshd -t, then the reload command
    gpu.reset           uuid                              nvidia-smi --gpu-reset -i <uuid>
    node.reboot         -                                 systemctl reboot
    helper.hello        -                                 nothing: the helper's version and directories
    update.stage        offset, data (base64)             append to the staged release in <install>, 0600
    update.install      the release's signed fields,      verify it again (signature under root's release roots,
                        signature, keys, running_version  sha256, size, swap rules), then place it in its slot
    update.step         step (arm|switch|confirm|disarm|  that step of the A/B swap (agent.upgrade.swap_rules);
                        switch-back|fail|abort), ...      ARM's release is the placed slot's, never the request's
    update.remember     refused (a release or null)       the install record's last refused release
    kmsg.follow         after_seq                         a stream: each NVIDIA XID record of the kernel log
    tpm.*               slot, digest, credential, secret  the node key, its AK and the EK in the helper's TPM
    vm.vfio             instance_id                       root reads the instance's vm.json itself, checks it and
                                                          each GPU's IOMMU group, binds them to vfio-pci and gives
                                                          /dev/vfio/<group> to the record's VMM user (vm_ops)
    vm.unvfio           instance_id                       those group nodes back to root, the devices back to their
                                                          host driver; never a group a running VMM's user holds
    vm.launch           instance_id, paused, user_data,   root checks the record, takes the groups, grants the VMM's
                        accel                             group its files, builds qemu's argv from the record and
                                                          starts root's qemu as the VMM user
    vm.stop             instance_id                       SIGKILL only that instance's qemu of its VMM user, then
                                                          its group nodes back to root
    vm.taps             instance_id                       the taps the record's NICs name by index, owned by its
                                                          VMM user, on bridges bc helper was given only
                                                          (--instance-bridge), once vm.rules has loaded their rules
    vm.untaps           instance_id                       those tap names deleted, only where each is a tap
    vm.grant-volume     instance_id, volume_id            the volume the record lists to its running VMM's group
                                                          (0660, 0640 read-only); vm.revoke-volume: back to the
                                                          node's group, 0600
    vm.rules            restore                           root builds the instances' nftables ruleset from
                                                          <node data>/instance-net.json (checked) and loads it;
                                                          `restore`: the guard's check, reloaded if it changed

The update, kmsg, GPU node unit, TPM and VM operations are in `update_ops`, `kmsg`,
`gpu_ops`, `tpm_ops` and `vm_ops`, their I/O in `update_effects`, `follow`, `effects`, `tpm_effects` and
`vm_effects` and `vm_net`.

Root-equivalent sysctl keys (`bc.protocol.root_equiv`) are refused even when a
quorum approved them: an unprivileged agent never asks root for what would
make it root. docs/node-security.md says so.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from agent.converge import env_files, gpu_packages, kubeadm, runtime_config
from agent.converge.host_units.gpu_sharing import MPS_SERVICE, mps_unit, plugin_config
from agent.helper import gpu_ops, kmsg, tpm_ops, update_ops, vm_ops
from agent.helper.plans import (
    Effect,
    FollowKmsg,
    Layout,
    Plan,
    Planner,
    Refused,
    Remove,
    Reply,
    Run,
    TpmCall,
    UpdateInstall,
    UpdateRemember,
    UpdateStage,
    UpdateStep,
    Write,
    WriteInPlace,
)
from agent.helper.plans import arg_int as _int
from agent.helper.plans import arg_str as _str
from agent.hw import cdi
from agent.hw.limits import InvalidLimits, Limits, allocation_of_slice, cgroup_path, hugetlb_limits, slice_properties
from bc.protocol import ssh_lines
from bc.protocol.host_units import UnitInvalid, parse_modules, parse_values
from bc.protocol.root_equiv import sysctl_key_problem

VERSION = 1
MAX_DATA = 1 << 20

__all__ = [  # the plan vocabulary (agent.helper.plans), re-exported for the table's callers
    "Effect",
    "FollowKmsg",
    "Layout",
    "Plan",
    "Refused",
    "Remove",
    "Reply",
    "Run",
    "TpmCall",
    "UpdateInstall",
    "UpdateRemember",
    "UpdateStage",
    "UpdateStep",
    "Write",
    "WriteInPlace",
    "plan",
]


def _data(req: Mapping[str, Any]) -> str:
    v = _str(req, "data", limit=MAX_DATA)
    if "\0" in v:
        raise Refused("data has a NUL")
    return v


def _allocation(req: Mapping[str, Any]) -> str:
    aid = _str(req, "allocation_id")
    if not cdi.valid_allocation_id(aid):
        raise Refused(f"allocation_id {aid!r} is not an allocation id")
    return aid


# -- hold files ------------------------------------------------------------------------------------

_ENV_LINE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=[^\n\r\0]*")
_DEV_NODE = re.compile(r"/dev/nvidia[A-Za-z0-9_-]*(/[A-Za-z0-9_-]+)*")


def _hold_path(req: Mapping[str, Any], lay: Layout) -> tuple[str, str, Path]:
    kind, aid = _str(req, "kind"), _allocation(req)
    if kind == "cdi":
        return kind, aid, cdi.spec_path(lay.cdi_dir, aid)
    if kind == "allocation-env":
        return kind, aid, env_files.env_path(lay.env_dir, aid)
    raise Refused(f"kind {kind!r} is not cdi or allocation-env")


def check_cdi(aid: str, text: str) -> None:
    """A hold's CDI spec as the agent writes it: schema-valid, this allocation's, no hooks or mounts (a runtime
    runs a hook as root), device nodes only the GPU driver's."""
    try:
        doc = json.loads(text)
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        cdi.validate_spec(doc)
    except (ValueError, cdi.CdiError) as e:
        raise Refused(f"the CDI spec does not validate: {str(e)[:200]}") from None
    if (doc.get("annotations") or {}).get(cdi.ANN_ALLOCATION_ID) != aid:
        raise Refused(f"the CDI spec is not allocation {aid}'s")
    edits = [doc.get("containerEdits") or {}, *((d.get("containerEdits") or {}) for d in doc.get("devices", []))]
    for edit in edits:
        if set(edit) - {"env", "deviceNodes"}:
            raise Refused(f"the CDI spec edits {sorted(set(edit) - {'env', 'deviceNodes'})}; only env and deviceNodes")
        for node in edit.get("deviceNodes", []):
            path = node.get("path", "") if isinstance(node, dict) else ""
            if (
                not isinstance(path, str)
                or not _DEV_NODE.fullmatch(path)
                or set(node) - {"path", "type", "major", "minor"}
            ):
                raise Refused(f"the CDI spec names device node {path!r}; only /dev/nvidia* nodes")
        if not all(isinstance(x, str) and _ENV_LINE.fullmatch(x) for x in edit.get("env", [])):
            raise Refused("the CDI spec's env is not KEY=VALUE lines")


def check_env(aid: str, text: str) -> None:
    lines = text.split("\n")
    if lines[-1] != "" or lines[0] != env_files.marker(aid):
        raise Refused(f"the env file does not start with allocation {aid}'s marker or end with a newline")
    for line in lines[1:-1]:
        if not _ENV_LINE.fullmatch(line):
            raise Refused(f"env line {line[:80]!r} is not KEY=VALUE")


def _file_write(req: Mapping[str, Any], lay: Layout) -> Plan:
    kind, aid, path = _hold_path(req, lay)
    text = _data(req)
    (check_cdi if kind == "cdi" else check_env)(aid, text)
    return (Write(path, text.encode()),)


def _file_remove(req: Mapping[str, Any], lay: Layout) -> Plan:
    return (Remove(_hold_path(req, lay)[2]),)


# -- hold slices -----------------------------------------------------------------------------------

LIMIT_KEYS = ("cpu_millis", "memory_bytes", "hugepages_1gi", "hugepages_2mi", "cpus", "mems")


def _slice(req: Mapping[str, Any]) -> str:
    name = _str(req, "slice")
    aid = allocation_of_slice(name)
    if aid is None or not cdi.valid_allocation_id(aid):
        raise Refused(f"slice {name!r} is not a hold's slice (bc-alloc-<allocation id>.slice)")
    return name


def limits_of(raw: Any) -> Limits:
    if not isinstance(raw, dict) or set(raw) - set(LIMIT_KEYS):
        raise Refused(f"limits must be an object of {', '.join(LIMIT_KEYS)}")
    ints = {k: _int(raw, k, 0, 1 << 50) for k in LIMIT_KEYS[:4] if k in raw}
    strs = {k: _str(raw, k, limit=256) for k in LIMIT_KEYS[4:] if k in raw}
    limits = Limits(**ints, **strs)  # type: ignore[arg-type]
    try:
        limits.check()
    except InvalidLimits as e:
        raise Refused(str(e)) from None
    return limits


def _slice_apply(req: Mapping[str, Any], lay: Layout) -> Plan:
    name, limits = _slice(req), limits_of(req.get("limits"))
    props = {"MemoryAccounting": "yes", **slice_properties(limits)}
    plan: list[Effect] = [
        Run(("systemctl", "set-property", "--runtime", name, *(f"{k}={v}" for k, v in props.items()))),
        Run(("systemctl", "start", name)),
    ]
    hugetlb = hugetlb_limits(limits)
    if hugetlb:
        parts, here = cgroup_path(name).split("/"), lay.cgroup_root
        for part in parts[:-1]:  # the root and every ancestor hand the controller down
            plan.append(WriteInPlace(here / "cgroup.subtree_control", "+hugetlb"))
            here = here / part
        plan.append(WriteInPlace(here / "cgroup.subtree_control", "+hugetlb"))
        plan += [WriteInPlace(here / parts[-1] / k, str(v)) for k, v in sorted(hugetlb.items())]
    return tuple(plan)


def _slice_remove(req: Mapping[str, Any], lay: Layout) -> Plan:
    name = _slice(req)
    return Run(("systemctl", "stop", name)), Run(("systemctl", "revert", name))


# -- host units ------------------------------------------------------------------------------------


def _sysctl_file(text: str) -> None:
    values: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        key, sep, value = line.partition(" = ")
        if not sep:
            raise Refused(f"sysctl line {line[:80]!r} is not 'key = value'")
        values[key] = value
    try:
        parse_values(values)
    except UnitInvalid as e:
        raise Refused(str(e)) from None
    for key, value in values.items():
        problem = sysctl_key_problem(key, value)
        if problem:
            raise Refused(f"the drop-in {problem}; the helper sets only keys an operator may")


def _modules_file(text: str) -> None:
    try:
        parse_modules({"modules": [x for x in text.splitlines() if x and not x.startswith("#")]})
    except UnitInvalid as e:
        raise Refused(str(e)) from None


def _rendered(render: Callable[[int], bytes], pattern: str) -> Callable[[str], None]:
    """A file the helper accepts only exactly as bc renders it (a unit's ExecStart is root's to choose)."""

    def check(text: str) -> None:
        m = re.search(pattern, text)
        if m is None or render(int(m.group(1))).decode() != text:
            raise Refused("the file is not one bc renders")

    return check


HOST_FILES: dict[str, tuple[str, Callable[[str], None]]] = {
    "sysctl": ("etc/sysctl.d/90-bc-sysctl.conf", _sysctl_file),
    "kernel-modules": ("etc/modules-load.d/bc-kernel-modules.conf", _modules_file),
    "gpu-sharing.mps": (f"etc/systemd/system/{MPS_SERVICE}", _rendered(mps_unit, r"PERCENTAGE=(\d{1,3})\n")),
    "gpu-sharing.plugin": ("etc/bc/gpu-sharing/device-plugin.yaml", _rendered(plugin_config, r"replicas: (\d{1,4})\n")),
}
"""The host units' drop-ins, by key: the agent names a key, the helper the path."""

HOST_FILE_KEYS = {rel: key for key, (rel, _) in HOST_FILES.items()}

_GPU = r"\d{1,3}"
_PROFILES = r"[0-9a-z.+]{1,24}(,[0-9a-z.+]{1,24}){0,15}"
HOST_COMMANDS: tuple[tuple[str, ...], ...] = (
    ("sysctl", "-p"),
    ("sysctl", "--system"),
    ("modprobe", r"[A-Za-z0-9_-]{1,56}"),
    ("nvidia-smi", "-i", _GPU, "-mig", "[01]"),
    ("nvidia-smi", "mig", "-i", _GPU, "-dci"),
    ("nvidia-smi", "mig", "-i", _GPU, "-dgi"),
    ("nvidia-smi", "mig", "-i", _GPU, "-cgi", _PROFILES, "-C"),
    ("nvidia-smi", "-c", "DEFAULT|EXCLUSIVE_PROCESS"),
    ("systemctl", "daemon-reload"),
    ("systemctl", "enable|restart", re.escape(MPS_SERVICE)),
    ("systemctl", "disable", "--now", re.escape(MPS_SERVICE)),
    # the GPU node units' fixed commands (agent.converge.gpu_packages, runtime_config, kubeadm): no variable part
    *(tuple(map(re.escape, argv)) for argv in gpu_packages.driver_reload_argv()),
    *(tuple(map(re.escape, gpu_packages.fabric_manager_argv(a))) for a in ("enable", "restart", "disable")),
    *(("systemctl", "restart", re.escape(service)) for service in runtime_config.SERVICES.values()),
    tuple(map(re.escape, kubeadm.RESET_ARGV)),
)
"""The host units' commands, each token a full-match regex. `sysctl -p` loads the helper's own drop-in."""


def _host_file(req: Mapping[str, Any], lay: Layout) -> tuple[Path, Callable[[str], None]]:
    key = _str(req, "file")
    if key not in HOST_FILES:
        raise Refused(f"file {key!r} is not one of {', '.join(sorted(HOST_FILES))}")
    rel, check = HOST_FILES[key]
    return lay.root / rel, check


def _host_file_write(req: Mapping[str, Any], lay: Layout) -> Plan:
    path, check = _host_file(req, lay)
    text = _data(req)
    check(text)
    return (Write(path, text.encode()),)


def _host_file_remove(req: Mapping[str, Any], lay: Layout) -> Plan:
    return (Remove(_host_file(req, lay)[0]),)


def _hugepages(req: Mapping[str, Any], lay: Layout) -> Plan:
    size, count = _int(req, "size_kb", 4, 1 << 24), _int(req, "count", 0, 1 << 24)
    node = req.get("node")
    if node is None:
        rel = f"sys/kernel/mm/hugepages/hugepages-{size}kB/nr_hugepages"
    else:
        rel = f"sys/devices/system/node/node{_int(req, 'node', 0, 1023)}/hugepages/hugepages-{size}kB/nr_hugepages"
    return (WriteInPlace(lay.root / rel, str(count)),)


def _host_run(req: Mapping[str, Any], lay: Layout) -> Plan:
    argv = req.get("argv")
    if not isinstance(argv, list) or not all(isinstance(a, str) and len(a) <= 256 for a in argv):
        raise Refused("argv must be a list of strings")
    for pattern in HOST_COMMANDS:
        if len(pattern) == len(argv) and all(re.fullmatch(p, a) for p, a in zip(pattern, argv, strict=True)):
            if argv == ["sysctl", "-p"]:
                return (Run(("sysctl", "-p", str(lay.root / HOST_FILES["sysctl"][0]))),)
            return (Run(tuple(argv)),)
    raise Refused(f"command {' '.join(argv)[:120]!r} is not one the host units run")


# -- sshd ------------------------------------------------------------------------------------------

SSHD_FILES = {"ca": "ca.pub", "krl": "revoked.krl", "krl-src": "revoked.krl.src", "dropin": "sshd.conf"}
SSHD_RELOAD = ("systemctl", "reload", "ssh")


def _sshd_path(req: Mapping[str, Any], lay: Layout) -> tuple[str, Path]:
    key = _str(req, "file")
    if key == "principals":
        user = _str(req, "user")
        problem = ssh_lines.principal_problem(user)
        if problem:
            raise Refused(problem)
        return key, lay.ssh_dir / "principals" / user
    if key not in SSHD_FILES:
        raise Refused(f"file {key!r} is not one of {', '.join(sorted([*SSHD_FILES, 'principals']))}")
    return key, lay.ssh_dir / SSHD_FILES[key]


def check_sshd(key: str, data: str, lay: Layout) -> None:
    """Each file's lines are what the access converger writes: nothing there can add a directive to sshd."""
    lines = [x for x in data.splitlines() if x and not x.startswith("#")]
    if key == "ca":
        problem = next((p for p in map(ssh_lines.key_line_problem, lines) if p), None)
    elif key == "principals":
        problem = next((p for p in map(ssh_lines.section_principal_problem, lines) if p), None)
    elif key == "dropin":
        d = lay.ssh_dir
        want = {
            f"TrustedUserCAKeys {d}/ca.pub",
            f"AuthorizedPrincipalsFile {d}/principals/%u",
            f"RevokedKeys {d}/revoked.krl",
        }
        problem = None if set(lines) <= want else "the sshd drop-in may only name the CA, principals and KRL files"
    else:  # krl, krl-src: the KRL is binary (ssh-keygen's output) and carries no directive; sshd reads only it
        problem = None
    if problem:
        raise Refused(problem)


def _sshd_write(req: Mapping[str, Any], lay: Layout) -> Plan:
    key, path = _sshd_path(req, lay)
    data = _str(req, "data", limit=MAX_DATA)
    if key != "krl":  # the KRL is binary, sent as latin-1 text
        check_sshd(key, data, lay)
    return (Write(path, data.encode("latin-1" if key == "krl" else "utf-8")),)


def _sshd_remove(req: Mapping[str, Any], lay: Layout) -> Plan:
    return (Remove(_sshd_path(req, lay)[1]),)


def _sshd_check(req: Mapping[str, Any], lay: Layout) -> Plan:
    return (Run(("sshd", "-t", "-f", str(lay.root / "etc/ssh/sshd_config"))),)


def _sshd_reload(req: Mapping[str, Any], lay: Layout) -> Plan:
    return (*_sshd_check(req, lay), Run(SSHD_RELOAD))


# -- the rest --------------------------------------------------------------------------------------

_UUID = re.compile(r"GPU-[0-9a-fA-F-]{8,64}")


def _gpu_reset(req: Mapping[str, Any], lay: Layout) -> Plan:
    uuid = _str(req, "uuid")
    if not _UUID.fullmatch(uuid):
        raise Refused(f"uuid {uuid[:80]!r} is not a GPU UUID")
    return (Run(("nvidia-smi", "--gpu-reset", "-i", uuid)),)


def _reboot(req: Mapping[str, Any], lay: Layout) -> Plan:
    return (Run(("systemctl", "reboot")),)


def _hello(req: Mapping[str, Any], lay: Layout) -> Plan:
    dirs = {
        "cdi_dir": lay.cdi_dir,
        "env_dir": lay.env_dir,
        "ssh_dir": lay.ssh_dir,
        "install_dir": lay.install_dir,
        "release_roots": lay.release_roots,
        "root": lay.root,
    }
    return (Reply({"version": VERSION, **{k: str(v) for k, v in dirs.items()}}),)


TABLE: dict[str, tuple[frozenset[str], Planner]] = {
    "file.write": (frozenset({"kind", "allocation_id", "data"}), _file_write),
    "file.remove": (frozenset({"kind", "allocation_id"}), _file_remove),
    "slice.apply": (frozenset({"slice", "limits"}), _slice_apply),
    "slice.remove": (frozenset({"slice"}), _slice_remove),
    "host.file.write": (frozenset({"file", "data"}), _host_file_write),
    "host.file.remove": (frozenset({"file"}), _host_file_remove),
    "host.hugepages": (frozenset({"size_kb", "node", "count"}), _hugepages),
    "host.run": (frozenset({"argv"}), _host_run),
    "sshd.write": (frozenset({"file", "user", "data"}), _sshd_write),
    "sshd.remove": (frozenset({"file", "user"}), _sshd_remove),
    "sshd.check": (frozenset(), _sshd_check),
    "sshd.reload": (frozenset(), _sshd_reload),
    "gpu.reset": (frozenset({"uuid"}), _gpu_reset),
    "node.reboot": (frozenset(), _reboot),
    "helper.hello": (frozenset(), _hello),
    **update_ops.TABLE,
    **kmsg.TABLE,
    **gpu_ops.TABLE,
    **tpm_ops.TABLE,
    **vm_ops.TABLE,
}


def plan(request: Any, layout: Layout) -> Plan:
    """The effects of `request`, or `Refused`. Nothing outside TABLE; no argument it does not name."""
    if not isinstance(request, dict):
        raise Refused("a request is a JSON object")
    op = request.get("op")
    if request.get("v") != VERSION:
        raise Refused(f"protocol version {request.get('v')!r} is not {VERSION}: restart bc node and bc helper together")
    if not isinstance(op, str) or op not in TABLE:
        raise Refused(f"operation {str(op)[:60]!r} is not in the helper's table")
    allowed, planner = TABLE[op]
    unknown = set(request) - allowed - {"op", "v"}
    if unknown:
        raise Refused(f"{op} takes no {', '.join(sorted(map(str, unknown)))[:120]}")
    try:
        return planner(request, layout)
    except Refused as e:
        raise Refused(f"{op}: {e}") from None
