"""Which spec changes are root-equivalent: one table, applied by the control plane and again by the node.

A spec change that can make a node run code as root is as destructive as a
reboot, so storing it needs the admin role and, once approvers exist, a
quorum batch over the exact change (`bc.control.quorum.spec_changes`); the node takes
it only with that batch's signatures and its leaf's proof (`agent.spec_quorum`).

`FIELDS` classifies every field the NodeSpec schema knows, by its dotted path
under NodeSpec (`access.ssh_ca_keys`, `host.units.settings_json`); a unit
test walks the schema and fails on any field missing from it, so a new field
cannot slip in unclassified. The classes:

| class            | root-equivalent when                                                    |
|------------------|-------------------------------------------------------------------------|
| `operator`       | never (an operator may set it)                                          |
| `any-change`     | it changes at all (`daemon.*`, `access.exec_ticket_jwks`)               |
| `added`          | it gains an entry (`access.ssh_ca_keys`: a CA the node would trust)     |
| `added-principal`| it gains a principal; at the node, one that maps to uid 0 there         |
| `removed`        | it loses an entry (`access.revoked_serials`: un-revoking a certificate) |
| `host-unit`      | a unit per `UNITS`: `kernel-modules` loading a new module, a sysctl key |
|                  | outside `SYSCTL_OPERATOR_PREFIXES` or in `SYSCTL_ROOT_KEYS`, any unit   |
|                  | this table does not know (a future unit); every change of the units that |
|                  | install packages or join a cluster (`nvidia-driver`, `fabric-manager`,  |
|                  | `container-toolkit`, `kubernetes`)                                      |

Revoking (`bc ssh revoke`, a serial added to the KRL) takes privilege away and
is never root-equivalent; a serial leaving the KRL is, on both ends (the
control plane keeps every revoked serial in the KRL, expired or not, so no
ordinary write removes one). At the node one rule reads differently
(`Viewpoint.at_node`): a principal counts only when it names this node and its
user maps to uid 0 there (`getpwnam`: `root`, `toor`, any spelling), since
the control plane adds ordinary users' principals for every `bc ssh grant`.

Pure: no I/O; the node passes in how it resolves a user.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import Message

from bc.protocol.canonical import canonical_json, message_to_dict
from bc.protocol.pb import spec_pb2
from bc.protocol.ssh_lines import NODE_PRINCIPAL

SPEC_BATCH_KIND = "spec.set"
"""The kind of the batch (and of its one leaf) that approves one node's root-equivalent section."""

OPERATOR, ANY_CHANGE, ADDED, ADDED_PRINCIPAL, REMOVED, HOST_UNIT = (
    "operator",
    "any-change",
    "added",
    "added-principal",
    "removed",
    "host-unit",
)

FIELDS: Mapping[str, str] = {
    # host: config units; what each one may do is in UNITS below.
    "host.units": HOST_UNIT,
    "host.units.name": HOST_UNIT,
    "host.units.settings_json": HOST_UNIT,
    # devices: written by reservations only (CDI specs, env lines, cgroup limits of a hold).
    "devices.assignments": OPERATOR,
    "devices.assignments.allocation_id": OPERATOR,
    "devices.assignments.reservation_id": OPERATOR,
    "devices.assignments.binding": OPERATOR,
    "devices.assignments.devices": OPERATOR,
    "devices.assignments.devices.device_class": OPERATOR,
    "devices.assignments.devices.atom_id": OPERATOR,
    "devices.assignments.env": OPERATOR,
    "devices.assignments.limits": OPERATOR,
    "devices.assignments.limits.cpu_millis": OPERATOR,
    "devices.assignments.limits.memory_bytes": OPERATOR,
    "devices.assignments.limits.hugepages_1gi": OPERATOR,
    "devices.assignments.limits.hugepages_2mi": OPERATOR,
    "devices.assignments.limits.cpus": OPERATOR,
    "devices.assignments.limits.mems": OPERATOR,
    # instances: VMs (docs/instances.md); what runs inside is not the host's root, and the kernel and initrd
    # are file names in the node's own instance-boot/ directory, never host paths.
    "instances.instances": OPERATOR,
    "instances.instances.id": OPERATOR,
    "instances.instances.runtime": OPERATOR,
    "instances.instances.size": OPERATOR,
    "instances.instances.image": OPERATOR,
    "instances.instances.nics": OPERATOR,
    "instances.instances.gpus": OPERATOR,
    "instances.instances.state": OPERATOR,
    "instances.instances.vcpus": OPERATOR,
    "instances.instances.memory_mib": OPERATOR,
    "instances.instances.kernel": OPERATOR,
    "instances.instances.initrd": OPERATOR,
    "instances.instances.cmdline": OPERATOR,
    "instances.instances.allocation_id": OPERATOR,
    # the guest's user data, by name: the broker's scope decides which nodes may read it, and it goes to the
    # guest (fw_cfg), not to anything the host runs.
    "instances.instances.user_data_secret_ref": OPERATOR,
    # networks, disks, placement and snapshots of a VM: the guest's world. Bridges are the host's own (the node
    # refuses a bc* name), images and snapshots arrive over https with a digest and are checked as untrusted
    # input (no backing or data file), volumes live in the node's volume store, GPUs are booked through the
    # allocation's BINDING_INSTANCE like any hold.
    "instances.instances.network_policy": OPERATOR,
    "instances.instances.ssh_from_host_only": OPERATOR,
    "instances.instances.nics.bridge": OPERATOR,
    "instances.instances.nics.mac": OPERATOR,
    "instances.instances.nics.addresses": OPERATOR,
    "instances.instances.volumes": OPERATOR,
    "instances.instances.volumes.volume": OPERATOR,
    "instances.instances.volumes.read_only": OPERATOR,
    "instances.instances.placement": OPERATOR,
    "instances.instances.placement.cpus": OPERATOR,
    "instances.instances.placement.mems": OPERATOR,
    "instances.instances.placement.hugepage_mib": OPERATOR,
    "instances.instances.placement.balloon": OPERATOR,
    "instances.instances.restore_from": OPERATOR,
    "instances.instances.restore_from.url": OPERATOR,
    "instances.instances.restore_from.sha256": OPERATOR,
    "instances.instances.identity_rebind_ref": OPERATOR,
    "instances.instances.disk_size_bytes": OPERATOR,
    "instances.images": OPERATOR,
    "instances.images.name": OPERATOR,
    "instances.images.url": OPERATOR,
    "instances.images.sha256": OPERATOR,
    "instances.images.format": OPERATOR,
    "instances.volumes": OPERATOR,
    "instances.volumes.id": OPERATOR,
    "instances.volumes.serial": OPERATOR,
    "instances.volumes.size_bytes": OPERATOR,
    # access: whoever may log in, and as whom.
    "access.exec_ticket_jwks": ANY_CHANGE,
    "access.ssh_ca_keys": ADDED,
    "access.principals": ADDED_PRINCIPAL,
    "access.revoked_serials": REMOVED,
    # telemetry: where metrics go.
    "telemetry.otlp_endpoint": OPERATOR,
    "telemetry.export_interval_s": OPERATOR,
    "telemetry.resource_attributes": OPERATOR,
    "telemetry.resource_attributes.key": OPERATOR,
    "telemetry.resource_attributes.value": OPERATOR,
    "telemetry.headers_secret_ref": OPERATOR,
    "telemetry.protocol": OPERATOR,
    # daemon: the release the node runs (channel and pins) is the code that runs as root.
    "daemon.version": ANY_CHANGE,
    "daemon.url": ANY_CHANGE,
    "daemon.sha256": ANY_CHANGE,
    "daemon.signature": ANY_CHANGE,
    "daemon.sequence": ANY_CHANGE,
    "daemon.size": ANY_CHANGE,
    "daemon.name": ANY_CHANGE,
    "daemon.platform": ANY_CHANGE,
    # site (docs/metal.md): cached images and the boot server are an operator's. The machines are root's: a
    # machine's BMC URL is where the site sends that BMC's credentials (even for bmc.query, an operator's
    # kind), and its MACs decide who is answered with a ramdisk join token. So are where the site reads the
    # credentials from, and what site.httpProxy may reach.
    "site.boot_lease_state": OPERATOR,
    "site.cache_images": OPERATOR,
    "site.cache_images.url": OPERATOR,
    "site.cache_images.sha256": OPERATOR,
    "site.cache_images.format": OPERATOR,
    "site.machines": ANY_CHANGE,
    "site.machines.name": ANY_CHANGE,
    "site.machines.bmc_url": ANY_CHANGE,
    "site.machines.system_id": ANY_CHANGE,
    "site.machines.macs": ANY_CHANGE,
    "site.credentials_file": ANY_CHANGE,
    "site.credentials_secret_ref": ANY_CHANGE,
    "site.boot": OPERATOR,
    "site.boot.interface": OPERATOR,
    "site.boot.dhcp_range": OPERATOR,
    "site.boot.http_address": OPERATOR,
    "site.proxy_targets": ANY_CHANGE,
    "site.proxy_targets.node_id": ANY_CHANGE,
    "site.proxy_targets.addresses": ANY_CHANGE,
    "site.proxy_targets.names": ANY_CHANGE,
}
"""Every NodeSpec field by dotted path, and its class (the module docstring's table)."""

# -- sysctl ----------------------------------------------------------------------------------------

SYSCTL_OPERATOR_PREFIXES: tuple[str, ...] = (
    "net.",
    "vm.",
    "kernel.numa_balancing",
    "kernel.shmmax",
    "kernel.shmall",
    "kernel.shmmni",
    "kernel.msgmax",
    "kernel.msgmnb",
    "kernel.msgmni",
    "kernel.sem",
    "kernel.pid_max",
    "kernel.threads-max",
    "kernel.sched_autogroup_enabled",
    "kernel.core_pattern",
    "kernel.core_uses_pid",
    "fs.file-max",
    "fs.nr_open",
    "fs.aio-max-nr",
    "fs.inotify.",
)
"""The sysctl keys an operator may set (a key equal to or under one of these); every other key is admin's."""

SYSCTL_ROOT_KEYS: tuple[str, ...] = (
    "vm.mmap_min_addr",
    "vm.unprivileged_userfaultfd",
    "net.core.bpf_jit_enable",
    "net.core.bpf_jit_harden",
    "net.core.bpf_jit_kallsyms",
    "kernel.modprobe",
    "kernel.hotplug",
    "kernel.poweroff_cmd",
    "kernel.usermodehelper.",
    "fs.binfmt_misc.",
    "kernel.kexec_load_disabled",
    "kernel.unprivileged_bpf_disabled",
    "kernel.yama.",
    "kernel.kptr_restrict",
    "kernel.dmesg_restrict",
    "kernel.sysrq",
)
"""Keys that name a program the kernel runs as root or widen its attack surface: root-equivalent even under an
operator prefix (listed whole here for the docs, though only the first few sit under one)."""


def _matches(key: str, prefixes: Sequence[str]) -> bool:
    return any(key == p.rstrip(".") or key.startswith(p if p.endswith(".") else p + ".") for p in prefixes)


def sysctl_key_problem(key: str, value: str) -> str | None:
    """Why setting `key` to `value` is root-equivalent, or None when an operator may."""
    if _matches(key, SYSCTL_ROOT_KEYS):
        return f"sets sysctl {key}, which names a program the kernel runs or widens its attack surface"
    if key == "kernel.core_pattern" and value.lstrip().startswith("|"):
        return "sets kernel.core_pattern to a pipe, a program the kernel runs as root on every core dump"
    if not _matches(key, SYSCTL_OPERATOR_PREFIXES):
        return f"sets sysctl {key}, which is not among the keys an operator may set"
    return None


def _sysctl(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    for key, value in sorted(new.items()):
        if key in old and str(old[key]).strip() == str(value).strip():
            continue
        why = sysctl_key_problem(str(key), str(value))
        if why is not None:
            out.append(why)
    return out


def _kernel_modules(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    before = set(_strings(old.get("modules")))
    added = [m for m in _strings(new.get("modules")) if m not in before]
    return [f"loads the kernel module {m} (code in the kernel)" for m in added]


def _never(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    return []


def _always(why: str) -> Callable[[Mapping[str, Any], Mapping[str, Any]], list[str]]:
    """A unit whose every addition or change installs root code or hands root to someone else."""

    def rule(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
        return [why]

    return rule


UnitRule = Callable[[Mapping[str, Any], Mapping[str, Any]], list[str]]

UNITS: Mapping[str, UnitRule] = {
    "sysctl": _sysctl,
    "kernel-modules": _kernel_modules,
    "hugepages": _never,
    "mig": _never,
    "gpu-sharing": _never,
    "nvidia-driver": _always(
        "installs an NVIDIA driver from the OS package manager (kernel modules and root packages)"
    ),
    "fabric-manager": _always("installs and runs NVIDIA Fabric Manager (a package and a root service)"),
    "container-toolkit": _always(
        "installs nvidia-container-toolkit and changes the container runtimes' configuration (what every container"
        " start runs as root)"
    ),
    "kubernetes": _always("joins the node to a Kubernetes cluster, whose control plane then runs pods on it as root"),
}
"""The host units this table knows; a unit missing here is root-equivalent whenever it is added or changed."""


def _strings(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


def _settings(text: str) -> Mapping[str, Any]:
    try:
        doc = json.loads(text or "{}")
    except ValueError:
        return {"": text}  # unparsable: compared as text; the spec checks refuse it anyway
    return doc if isinstance(doc, dict) else {"": doc}


# -- the rules by class ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Viewpoint:
    """Who applies the table: the control plane (default) or a node, which can resolve users."""

    node_id: str = ""
    at_node: bool = False
    is_root_user: Callable[[str], bool] | None = None
    """At the node: whether a local user name maps to uid 0 (getpwnam)."""


def _host_units(old: Message, new: Message, view: Viewpoint) -> list[str]:
    assert isinstance(old, spec_pb2.HostSection) and isinstance(new, spec_pb2.HostSection)
    before = {u.name: u.settings_json for u in old.units}
    out: list[str] = []
    for unit in new.units:
        if unit.name in before and _settings(before[unit.name]) == _settings(unit.settings_json):
            continue
        rule = UNITS.get(unit.name)
        if rule is None:
            out.append(f"sets the host unit {unit.name!r}, which may load code or run programs")
            continue
        was = _settings(before.get(unit.name, "{}"))
        out.extend(f"{unit.name}: {why}" for why in rule(was, _settings(unit.settings_json)))
    return out


def _ca_line(key: str) -> str:
    return " ".join(key.split()[:2])


def _field_rule(path: str, cls: str, old: Message, new: Message, view: Viewpoint) -> list[str]:
    name = path.split(".", 1)[1]
    a, b = getattr(old, name), getattr(new, name)
    if cls == ANY_CHANGE:
        return [f"changes {path}"] if a != b else []
    if cls == ADDED:
        have = {_ca_line(str(x)) for x in a}
        return [f"adds to {path}: {_ca_line(str(x))[:60]}…" for x in b if _ca_line(str(x)) not in have]
    if cls == REMOVED:
        gone = sorted(set(a) - set(b))
        return [f"removes {x} from {path}" for x in gone]
    if cls == ADDED_PRINCIPAL:
        added = [str(p) for p in b if p not in set(a)]
        if not view.at_node or view.is_root_user is None:
            return [f"adds the principal {p!r}" for p in added]
        out = []
        for p in added:
            m = NODE_PRINCIPAL.fullmatch(p)
            if m is not None and m.group(2) == view.node_id and view.is_root_user(m.group(1)):
                out.append(f"adds the principal {p!r}, whose user is root (uid 0) on this node")
        return out
    return []


def changes(section: str, old: Message, new: Message, view: Viewpoint = Viewpoint()) -> list[str]:
    """What makes the change of `section` from `old` to `new` root-equivalent (empty: an operator's change)."""
    if old == new:
        return []
    out: list[str] = []
    for fd in new.DESCRIPTOR.fields:
        path = f"{section}.{fd.name}"
        cls = FIELDS.get(path)
        if cls is None:  # fail closed: a field this table does not know
            if getattr(old, fd.name) != getattr(new, fd.name):
                out.append(f"changes {path}, which is not classified")
        elif cls == HOST_UNIT:
            out.extend(_host_units(old, new, view))
        elif cls != OPERATOR:
            out.extend(_field_rule(path, cls, old, new, view))
    return out


def spec_changes(old_spec: Message, new_spec: Message, view: Viewpoint = Viewpoint()) -> dict[str, list[str]]:
    """`changes` for every section of two NodeSpecs; only the root-equivalent ones are in the result."""
    found: dict[str, list[str]] = {}
    for fd in new_spec.DESCRIPTOR.fields:
        reasons = changes(fd.name, getattr(old_spec, fd.name), getattr(new_spec, fd.name), view)
        if reasons:
            found[fd.name] = reasons
    return found


# -- what the quorum signs -------------------------------------------------------------------------


def section_digest(section: str, msg: Message) -> bytes:
    """SHA-256 of `"bc.v1/spec-section\\n" + section + "\\n" + canonical JSON of the section`: the exact change a
    `spec.set` batch's leaf `(node, "spec.set", digest)` binds, computed the same way on both ends."""
    if "\n" in section:
        raise ValueError("a section name cannot contain a newline")
    text = canonical_json(message_to_dict(msg))
    return hashlib.sha256(f"bc.v1/spec-section\n{section}\n{text}".encode()).digest()
