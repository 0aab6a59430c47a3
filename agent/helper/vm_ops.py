"""The helper's operations for a confined qemu VMM's GPUs. Pure: they name the instance, root reads the rest.

    op          arguments     effects (as root, agent.helper.vm_effects)
    vm.vfio     instance_id   read `<node data>/instances/<id>/vm.json` (no symlink in that directory) and
                              check it (agent.helper.vm_rules): its VMM user in bc's range, its paths the node's,
                              each GPU one of this host's and its IOMMU group only GPUs, their functions and
                              bridges, no group node held by another running VMM's user
                              (agent.instances.vfio_rules); then bind every group to vfio-pci and give each
                              `/dev/vfio/<group>` to the VMM's user, 0600
    vm.unvfio   instance_id   the same reads and checks; refused when a running VMM's user holds a group; else
                              each group node back to root (root:root 0600) and every device handed back to its
                              host driver
    vm.launch   instance_id,  the same reads and checks (and its user data, `/run/bc/user-data/<id>`, a regular
                paused,       file, when `user_data`); its VMM user runs no process now; its groups as vm.vfio;
                user_data,    the VMM user's group on its directory (3770: the node keeps owning it, the sticky
                accel         bit keeps the VMM off the node's files), its disk and read-write volumes (0660),
                              its user data and read-only volumes (0640); then root's own qemu argv
                              (agent.instances.qemu_argv) from the record (accelerators: kvm, tcg; with
                              `-incoming defer -S` when its directory holds a restored `memory.state`, which
                              the node then feeds over QMP from a file it opened), run as that
                              user (its transient unit where systemd runs, else setpriv); once it is up, its QMP
                              socket, console and pid file get the node's group (0660/0640), so the node drives
                              it. Answers the pid and whether it waits for a memory state (`incoming`)
    vm.stop     instance_id   SIGKILL the pid in its qemu.pid only while that process is its VMM user's and its
                              command line is that instance's qemu, wait for it to end, then give back the group
                              nodes that user held
    vm.taps     instance_id   the same record read and checked; each NIC's tap is the one its index names
                              (agent.instances.net.names) on a bridge bc helper was given (--instance-bridge;
                              none: every tap refused), and the instances' rules root loaded name it (vm.rules
                              first); then each tap made owned by the VMM's user (an interface of that name
                              that is not a tap is left alone: refused), put on its bridge and up
    vm.untaps   instance_id   the same record read; each of those tap names deleted, only where it is a tap
    vm.grant-   instance_id,  the same reads and checks; the volume the record lists under that id (a regular
    volume      volume_id     file in `<node data>/volumes`) gets the group of the record's VMM user, which must
                              run a process (a live attach: the node lists it in the record first), 0660, 0640
                              read-only; `o+x` on the directories on the way, as vm.launch
    vm.revoke-  instance_id,  the same; that volume back to the node's group (its instances directory's), 0600
    volume      volume_id     (a live detach, before the node drops it from the record)
    vm.rules    restore       root reads `<node data>/instance-net.json` (every kept instance's network fields,
                              checked with the section's rules, bc.protocol.instance_net_rules), builds the
                              one ruleset (agent.instances.net.ruleset) with the host's addresses on their
                              bridges and loads it with one `nft -f` when it differs from what root loaded;
                              with `restore` (the agent's 5-s guard) it lists the three tables instead and
                              loads the same ruleset again when they changed. Answers whether it restored

The request carries the instance's id only: the GPUs, the uid and the paths
are the record's, read by root and checked as a claim, so the node can never
name a device or a file to root directly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.helper.plans import (
    Layout,
    Plan,
    Planner,
    Refused,
    VmLaunch,
    VmRules,
    VmStop,
    VmTaps,
    VmVfio,
    VmVolume,
    arg_str,
)
from agent.helper.vm_rules import VOLUME_ID
from bc.protocol.instance_rules import INSTANCE_ID


def _instance(req: Mapping[str, Any]) -> str:
    iid = arg_str(req, "instance_id", limit=63)
    if not INSTANCE_ID.fullmatch(iid):
        raise Refused(f"instance_id {iid!r} is not an instance id")
    return iid


def _vfio(req: Mapping[str, Any], lay: Layout) -> Plan:
    return (VmVfio(lay.instances_dir, _instance(req), give=True),)


def _unvfio(req: Mapping[str, Any], lay: Layout) -> Plan:
    return (VmVfio(lay.instances_dir, _instance(req), give=False),)


ACCELS = ("kvm", "tcg")


def _bool(req: Mapping[str, Any], key: str) -> bool:
    v = req.get(key, False)
    if not isinstance(v, bool):
        raise Refused(f"{key} must be true or false")
    return v


def _launch(req: Mapping[str, Any], lay: Layout) -> Plan:
    iid = _instance(req)
    user_data = lay.user_data_dir / iid if _bool(req, "user_data") else None
    accel = req.get("accel", ["kvm", "tcg"])
    if not isinstance(accel, list) or not accel or len(set(accel)) != len(accel) or set(accel) - set(ACCELS):
        raise Refused(f"accel must be a list of {' and '.join(ACCELS)}, each at most once")
    return (VmLaunch(lay.instances_dir, iid, _bool(req, "paused"), user_data, tuple(accel)),)


def _stop(req: Mapping[str, Any], lay: Layout) -> Plan:
    return (VmStop(lay.instances_dir, _instance(req)),)


def _taps(req: Mapping[str, Any], lay: Layout) -> Plan:
    return (VmTaps(lay.instances_dir, _instance(req), True, lay.instance_bridges),)


def _untaps(req: Mapping[str, Any], lay: Layout) -> Plan:
    return (VmTaps(lay.instances_dir, _instance(req), False, lay.instance_bridges),)


def _volume(give: bool) -> Planner:
    def planner(req: Mapping[str, Any], lay: Layout) -> Plan:
        iid = _instance(req)
        vid = arg_str(req, "volume_id", limit=80)
        if not VOLUME_ID.fullmatch(vid):
            raise Refused(f"volume_id {vid!r} is not a volume id")
        return (VmVolume(lay.instances_dir, iid, vid, give),)

    return planner


def _rules(req: Mapping[str, Any], lay: Layout) -> Plan:
    return (VmRules(lay.node_data, _bool(req, "restore")),)


TABLE: dict[str, tuple[frozenset[str], Planner]] = {
    "vm.vfio": (frozenset({"instance_id"}), _vfio),
    "vm.unvfio": (frozenset({"instance_id"}), _unvfio),
    "vm.launch": (frozenset({"instance_id", "paused", "user_data", "accel"}), _launch),
    "vm.stop": (frozenset({"instance_id"}), _stop),
    "vm.taps": (frozenset({"instance_id"}), _taps),
    "vm.untaps": (frozenset({"instance_id"}), _untaps),
    "vm.rules": (frozenset({"restore"}), _rules),
    "vm.grant-volume": (frozenset({"instance_id", "volume_id"}), _volume(True)),
    "vm.revoke-volume": (frozenset({"instance_id", "volume_id"}), _volume(False)),
}
