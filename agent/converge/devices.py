"""The devices converger: device assignments become CDI holds on this node.

Each pass reads the holds back from the CDI directory (the files are the
truth, not memory), releases the held assignments no longer desired, then
binds the desired ones in order: already-held ones first, so a hold that
shrinks frees its atoms before new holds are checked against them. Deciding
is a pure function (`plan`); the converger only does the file I/O it asks
for, off the event loop.

An assignment the node cannot honor fails terminally at that generation with
a reason (`overlap`, `device-missing`, `unsupported-binding`,
`unsupported-device`, `invalid-assignment`, `resources-exhausted`) while the
others still bind. A hold with limits (`DeviceAssignment.limits`) is admitted
against the host's memory first (`agent.hw.limits.admit`), and a
`BINDING_HOLD` one gets its cgroup-v2 slice `bc-alloc-<id>.slice` through the
slice seam (`agent.hw.slices`) before its CDI spec names it; a held hold whose
slice is gone (a reboot) gets it again, and a slice whose hold is gone is
stopped once nothing runs in it, retried on every pass. A `BINDING_INSTANCE`
assignment (whole GPUs passed through to the VM of its allocation) gets no
CDI spec: the converger records the booking instead
(`agent.instances.bookings`), read back as a hold for every rule
above, so a GPU is never both held and passed through; a converger without
that store (no instance runtime) refuses it `unsupported-binding`. A
file write that fails is retryable: the section stays PROGRESSING. The node
never drops an assignment on its own: a held hold whose device vanished
from the inventory is kept as it is, and while the journal holds no spec
(generation 0: lost or new) every hold found is adopted and none released
(`agent.converge.adoption`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf.message import Message

from agent.converge import adoption, env_files
from agent.converge.hold_slices import HoldSlices
from agent.converge.host_ops import DirectHoldFiles, HoldFiles
from agent.converge.run import CONVERGED, FAILED, SectionResult
from agent.hw import cdi
from agent.hw.base import HardwareBackend
from agent.hw.dev_nodes import DeviceNodes, DevNode, NodeFacts, node_facts
from agent.hw.limits import MIB, NO_LIMITS, HostMemory, InvalidLimits, Limits, admit, host_memory, slice_name
from agent.hw.slices import SliceManager
from agent.instances.bookings import InstanceBookings
from agent.instances.bookings import record as booking_record
from agent.offload import Offload, to_thread
from bc.protocol.atoms import (
    DEVICE_CLASSES,
    GPU_MIG,
    Atom,
    atoms_conflict,
    cdi_qualified,
    parse_atom,
)
from bc.protocol.pb import common_pb2, session_pb2, spec_pb2

log = logging.getLogger(__name__)

Report = session_pb2.AllocationReport

OVERLAP = "overlap"
DEVICE_MISSING = "device-missing"
UNSUPPORTED_BINDING = "unsupported-binding"
UNSUPPORTED_DEVICE = "unsupported-device"
INVALID_ASSIGNMENT = "invalid-assignment"
RESOURCES_EXHAUSTED = "resources-exhausted"
REASON_FAILED = "AllocationFailed"
REASON_WRITE_FAILED = "WriteFailed"
DEFAULT_MPS_PIPE_DIR = Path("/run/nvidia-mps")

_BINDINGS = (spec_pb2.BINDING_HOLD, spec_pb2.BINDING_KUBERNETES, spec_pb2.BINDING_INSTANCE)


class Refused(Exception):
    """An assignment this node cannot honor; `reason` is the AllocationFailed reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


# The plan: what one pass should do, in order.


@dataclass(frozen=True)
class Release:
    held: cdi.HeldSpec


@dataclass(frozen=True)
class Bind:
    """Write a new (or changed) hold and report it BOUND."""

    assignment: spec_pb2.DeviceAssignment
    doc: dict[str, Any]
    env: tuple[str, ...]
    limits: Limits = NO_LIMITS
    slice: str = ""  # the hold's slice, made before the CDI file; empty: none


@dataclass(frozen=True)
class Refresh:
    """An assignment already held as it is: rewrite only what drifted (env file, env lines), silently."""

    assignment: spec_pb2.DeviceAssignment
    held: cdi.HeldSpec
    doc: dict[str, Any] | None  # None: a device is gone from the inventory; keep the hold untouched
    env: tuple[str, ...]
    limits: Limits = NO_LIMITS
    slice: str = ""  # made again when it is missing or the limits changed


@dataclass(frozen=True)
class Fail:
    assignment: spec_pb2.DeviceAssignment
    reason: str
    message: str


Action = Release | Bind | Refresh | Fail


def resolve(atom: Atom, inventory: common_pb2.Inventory, facts: NodeFacts | None = None) -> cdi.ResolvedDevice:
    """The device an atom names on this node, or Refused(device-missing); `facts`: its device nodes."""
    for gpu in inventory.gpus:
        if gpu.uuid != atom.gpu_uuid:
            continue
        nodes: tuple[DevNode, ...] = ()
        if facts is not None and gpu.index in facts.gpus:
            nodes = (facts.gpus[gpu.index],)
        if atom.device_class == GPU_MIG:
            gi, ci = atom.numbers
            for m in gpu.mig_instances:
                if m.gi == gi and m.ci == ci and m.uuid:
                    caps = facts.mig_caps.get((gpu.index, gi, ci), ()) if facts is not None else ()
                    return cdi.ResolvedDevice(atom, m.uuid, gpu.index, nodes + tuple(caps))
            raise Refused(DEVICE_MISSING, f"GPU {gpu.uuid} has no MIG instance gi={gi} ci={ci}")
        return cdi.ResolvedDevice(atom, gpu.uuid, gpu.index, nodes)
    raise Refused(DEVICE_MISSING, f"no GPU {atom.gpu_uuid} on this node")


def check_assignment(a: spec_pb2.DeviceAssignment) -> list[Atom]:
    """The assignment's atoms, or Refused for what no inventory could change."""
    if not cdi.valid_allocation_id(a.allocation_id):
        raise Refused(INVALID_ASSIGNMENT, f"allocation id {a.allocation_id!r} is not a safe file name")
    if a.binding not in _BINDINGS:
        raise Refused(
            UNSUPPORTED_BINDING, f"binding {a.binding} is not BINDING_HOLD, BINDING_KUBERNETES or BINDING_INSTANCE"
        )
    try:
        Limits.from_proto(a.limits).check()
    except InvalidLimits as e:
        raise Refused(INVALID_ASSIGNMENT, str(e)) from None
    if not a.devices:
        raise Refused(INVALID_ASSIGNMENT, "the assignment names no devices")
    for line in a.env:
        problem = cdi.check_env_line(line)
        if problem:
            raise Refused(INVALID_ASSIGNMENT, problem)
    atoms: list[Atom] = []
    for ref in a.devices:
        if ref.device_class not in DEVICE_CLASSES:
            raise Refused(UNSUPPORTED_DEVICE, f"device class {ref.device_class!r} is not one of gpu, gpu.mig, gpu.slot")
        try:
            atoms.append(parse_atom(ref.device_class, ref.atom_id))
        except ValueError as e:
            raise Refused(DEVICE_MISSING, str(e)) from None
    if a.binding == spec_pb2.BINDING_INSTANCE:
        if any(not x.is_whole_gpu for x in atoms):
            raise Refused(UNSUPPORTED_DEVICE, "an instance assignment passes whole GPUs, not MIG instances or slots")
        if not Limits.from_proto(a.limits).empty or a.env:
            raise Refused(INVALID_ASSIGNMENT, "an instance assignment carries no limits or env: the VM's are its own")
    for i, x in enumerate(atoms):
        for y in atoms[i + 1 :]:
            if atoms_conflict(x, y):
                raise Refused(OVERLAP, f"{x.atom_id} and {y.atom_id} overlap within the assignment")
    return atoms


def plan(
    assignments: Sequence[spec_pb2.DeviceAssignment],
    held: Mapping[str, cdi.HeldSpec],
    inventory: common_pb2.Inventory,
    *,
    mps_pipe_dir: str | None = None,
    host: HostMemory | None = None,
    slices: bool = True,
    facts: NodeFacts | None = None,
    instances: bool = False,
    in_vms: Mapping[str, str] | None = None,
) -> list[Action]:
    """Releases (by allocation id), then each desired assignment: held ones first, then new ones.

    `host`: the host's memory for admission (None: not readable, no admission). `slices`: whether
    holds with limits get a slice (False when the converger has no slice seam). `facts`: the device
    nodes the specs name (agent.hw.dev_nodes; None: each GPU's node by path only). `instances`: whether
    this node takes `BINDING_INSTANCE` assignments (it has an instance runtime and the booking store).
    `in_vms`: the GPUs passed through to a VM now (uuid -> instance): a new hold never binds one.
    """
    wanted = {a.allocation_id for a in assignments}
    actions: list[Action] = [Release(h) for aid, h in sorted(held.items()) if aid not in wanted]
    committed: dict[str, tuple[Atom, ...]] = {aid: h.atoms for aid, h in held.items() if aid in wanted}
    booked: dict[str, Limits] = {
        a.allocation_id: Limits.from_proto(a.limits) for a in assignments if a.allocation_id in held
    }
    ordered = [a for a in assignments if a.allocation_id in held] + [
        a for a in assignments if a.allocation_id not in held
    ]
    seen: set[str] = set()
    for a in ordered:
        if a.allocation_id in seen:
            actions.append(Fail(a, INVALID_ASSIGNMENT, f"allocation {a.allocation_id} is assigned twice"))
            continue
        seen.add(a.allocation_id)
        if a.binding == spec_pb2.BINDING_INSTANCE and not instances:
            actions.append(Fail(a, UNSUPPORTED_BINDING, "this node runs no instances: BINDING_INSTANCE is not taken"))
            continue
        try:
            if a.allocation_id not in held and a.binding != spec_pb2.BINDING_INSTANCE:
                _check_not_in_vms(a, in_vms or {})
            actions.append(
                _decide(a, held.get(a.allocation_id), inventory, committed, mps_pipe_dir, booked, host, slices, facts)
            )
        except Refused as r:
            actions.append(Fail(a, r.reason, r.message))
    return actions


def _decide(
    a: spec_pb2.DeviceAssignment,
    held: cdi.HeldSpec | None,
    inventory: common_pb2.Inventory,
    committed: dict[str, tuple[Atom, ...]],
    mps_pipe_dir: str | None,
    booked: dict[str, Limits],
    host: HostMemory | None,
    slices: bool,
    facts: NodeFacts | None = None,
) -> Action:
    atoms = check_assignment(a)
    if a.binding == spec_pb2.BINDING_INSTANCE:
        return _decide_instance(a, atoms, held, inventory, committed)
    kubernetes = a.binding == spec_pb2.BINDING_KUBERNETES
    limits = Limits.from_proto(a.limits)
    # A Kubernetes hold's pods live in the kubelet's cgroups: no slice, though its limits still count.
    cgroup_parent = slice_name(a.allocation_id) if slices and not kubernetes and not limits.empty else ""
    same = (
        held is not None
        and not held.instance
        and held.atoms == tuple(atoms)
        and held.reservation_id == a.reservation_id
        and held.kubernetes == kubernetes
    )
    try:
        devices = [resolve(atom, inventory, facts) for atom in atoms]
    except Refused:
        if same and held is not None:
            # Never drop a hold on our own; its slice, if it had one, stays as the file says.
            return Refresh(a, held, None, (), held.limits or NO_LIMITS, held.cgroup_parent)
        raise
    if not same:
        _check_overlap(a.allocation_id, atoms, committed)
    if held is None and host is not None:
        problem = admit(limits, [v for k, v in sorted(booked.items()) if k != a.allocation_id], host)
        if problem:
            raise Refused(RESOURCES_EXHAUSTED, problem)
    env = cdi.env_lines(
        a.allocation_id,
        devices,
        kubernetes=kubernetes,
        extra_env=list(a.env),
        mps_pipe_dir=mps_pipe_dir,
        cgroup_parent=cgroup_parent,
    )
    doc = cdi.render_spec(
        a.allocation_id,
        a.reservation_id,
        devices,
        env,
        kubernetes=kubernetes,
        limits=limits,
        cgroup_parent=cgroup_parent,
        control_nodes=facts.control if facts is not None else (),
    )
    cdi.validate_spec(doc)
    if same and held is not None:
        return Refresh(a, held, doc, tuple(env), limits, cgroup_parent)
    committed[a.allocation_id] = tuple(atoms)
    booked[a.allocation_id] = limits
    return Bind(a, doc, tuple(env), limits, cgroup_parent)


def _check_not_in_vms(a: spec_pb2.DeviceAssignment, in_vms: Mapping[str, str]) -> None:
    """A new hold on a GPU a VM has now (its booking released while the VM runs): the same refusal as an
    overlap, so a GPU is never both held and passed through even when the control plane thinks it free."""
    for ref in a.devices:
        try:
            uuid = parse_atom(ref.device_class, ref.atom_id).gpu_uuid
        except ValueError:
            continue  # check_assignment refuses it
        if uuid in in_vms:
            raise Refused(OVERLAP, f"{ref.atom_id} is on GPU {uuid}, passed through to instance {in_vms[uuid]}")


def _check_overlap(allocation_id: str, atoms: Sequence[Atom], committed: Mapping[str, tuple[Atom, ...]]) -> None:
    for atom in atoms:
        for other_id, other_atoms in sorted(committed.items()):
            if other_id == allocation_id:
                continue
            for other in other_atoms:
                if atoms_conflict(atom, other):
                    raise Refused(OVERLAP, f"{atom.atom_id} overlaps {other.atom_id} held by {other_id}")


def _decide_instance(
    a: spec_pb2.DeviceAssignment,
    atoms: Sequence[Atom],
    held: cdi.HeldSpec | None,
    inventory: common_pb2.Inventory,
    committed: dict[str, tuple[Atom, ...]],
) -> Action:
    """A BINDING_INSTANCE assignment: booked (recorded) GPUs for the VM, overlap-checked like a hold, no CDI."""
    same = held is not None and held.instance and held.atoms == tuple(atoms) and held.reservation_id == a.reservation_id
    doc = booking_record(a.allocation_id, a.reservation_id, [x.gpu_uuid for x in atoms])
    try:
        for atom in atoms:
            resolve(atom, inventory)
    except Refused:
        if same and held is not None:
            return Refresh(a, held, None, ())  # never drop a booking on our own
        raise
    if same and held is not None:
        return Refresh(a, held, doc, ())
    if held is not None and not held.instance:
        raise Refused(INVALID_ASSIGNMENT, f"allocation {a.allocation_id} is held as a CDI hold, not for an instance")
    _check_overlap(a.allocation_id, atoms, committed)
    committed[a.allocation_id] = tuple(atoms)
    return Bind(a, doc, ())


class DevicesConverger:
    """Converges the `devices` section into `<cdi_dir>/bc-<id>.json` and `<env_dir>/bc-<id>.env`."""

    section: str = "devices"

    def holds_to_keep(self, held: Mapping[str, cdi.HeldSpec], generation: int) -> dict[str, cdi.HeldSpec] | None:
        """The adoption rule (`agent.converge.adoption.holds_to_keep`): a seam, so `bc sim --break` can show what
        a converger without it does after a journal loss."""
        return adoption.holds_to_keep(held, generation)

    def __init__(
        self,
        cdi_dir: Path,
        env_dir: Path,
        hw: HardwareBackend,
        node_id: str,
        *,
        mps_pipe_dir: Path = DEFAULT_MPS_PIPE_DIR,
        offload: Offload = to_thread,
        slices: SliceManager | None = None,
        dev_nodes: DeviceNodes | None = None,
        files: HoldFiles | None = None,
        instance_bookings: InstanceBookings | None = None,
        in_vms: Callable[[], Mapping[str, str]] | None = None,
    ) -> None:
        """`offload`: where the file work runs (agent.offload): a thread in production, inline in the simulator.

        `dev_nodes`: where the device nodes the CDI specs name come from (agent.hw.dev_nodes); None names
        each GPU's node by path only, which only tests of the plan's other rules use.

        `slices`: the hold slice seam (agent.hw.slices); None manages no slices (holds with limits then get
        none), which only tests of the CDI side use.

        `files`: where the CDI and env files are written (agent.converge.host_ops.HoldFiles); None writes them
        into `cdi_dir` and `env_dir` directly. The helper's (agent.helper.node_ops) writes them through
        `bc helper`; the converger reads them back from the same directories either way.
        """
        self.offload = offload
        self.files = files or DirectHoldFiles(cdi_dir, env_dir, offload=offload)
        self._slices = HoldSlices(slices)
        self.managed_slices = slices is not None
        self.cdi_dir = cdi_dir
        self.env_dir = env_dir
        self.hw = hw
        self.node_id = node_id
        self.mps_pipe_dir = mps_pipe_dir
        self.dev_nodes = dev_nodes
        self.instance_bookings = instance_bookings
        """Where BINDING_INSTANCE bookings are recorded (None: this node takes none, `unsupported-binding`)."""
        self.in_vms = in_vms
        """The GPUs passed through to VMs now, uuid -> instance (blocking: agent.instances.passthrough)."""
        self._failed_reported: set[tuple[str, int]] = set()
        self._adopted: set[str] = set()
        self.instances_committed_mib: Callable[[], int] = lambda: 0
        """What the VMs running or paused after the last `instances` pass commit (agent.converge.instances):
        a new hold is admitted only in what they leave, so VMs and holds never take what the other was
        promised. The composition sets it; left alone, no VM counts."""

    async def converge(self, desired: Message, generation: int) -> SectionResult:
        if not isinstance(desired, spec_pb2.DevicesSection):
            raise TypeError(f"the devices converger got a {type(desired).__name__}")
        await self.files.prepare()
        held, mps = await self.offload(self._scan)
        kept = self.holds_to_keep(held, generation)
        if kept is not None:
            return await self._adopt(kept)
        if self._adopted:
            log.info("event=allocation.adoption-ended generation=%d adopted=%d", generation, len(self._adopted))
            self._adopted = set()
        inventory = await self.offload(self.hw.inventory)
        host = host_memory(inventory)
        vms_mib = self.instances_committed_mib()
        if host is not None and vms_mib:
            host = dataclasses.replace(host, total_bytes=host.total_bytes - vms_mib * MIB)
        if host is None and any(a.limits.memory_bytes or a.limits.hugepages_1gi for a in desired.assignments):
            log.warning("event=allocation.admission_skipped reason=host-memory-unknown")
        facts = await self.offload(node_facts, self.dev_nodes, inventory) if self.dev_nodes is not None else None
        actions = plan(
            list(desired.assignments),
            held,
            inventory,
            mps_pipe_dir=mps,
            host=host,
            slices=self.managed_slices,
            facts=facts,
            instances=self.instance_bookings is not None,
            in_vms=await self.offload(self.in_vms) if self.in_vms is not None else None,
        )
        self._failed_reported = {k for k in self._failed_reported if k[1] == generation}

        events: list[Report] = []
        failures: list[str] = []
        write_errors: list[str] = []
        released: set[str] = set()
        bound: set[str] = set()
        unreleased: list[Atom] = []
        for action in actions:
            if isinstance(action, Fail):
                a = action.assignment
                failures.append(f"{a.allocation_id}: {action.reason} ({action.message})")
                key = (a.allocation_id, generation)
                if key not in self._failed_reported:
                    self._failed_reported.add(key)
                    events.append(
                        self._report(
                            a.allocation_id,
                            a.reservation_id,
                            generation,
                            Report.FAILED,
                            reason=action.reason,
                            message=action.message,
                        )
                    )
                    log.warning(
                        "event=allocation.failed allocation=%s reason=%s message=%r",
                        a.allocation_id,
                        action.reason,
                        action.message,
                    )
                continue
            if isinstance(action, Bind) and _conflicts_with(action, unreleased):
                # A release this pass could not finish still holds these atoms: binding now would double-book.
                write_errors.append(f"{action.assignment.allocation_id}: waits for a release that failed")
                continue
            try:
                await self._apply_slice(action)
                await self._apply(action)
            except OSError as e:
                if isinstance(action, Release):
                    unreleased.extend(action.held.atoms)
                write_errors.append(f"{_allocation_of(action)}: {e}")
                log.warning("event=allocation.write_failed allocation=%s error=%r", _allocation_of(action), str(e))
                continue
            if isinstance(action, Release):
                released.add(action.held.allocation_id)
                r = self._report(action.held.allocation_id, action.held.reservation_id, generation, Report.RELEASED)
                r.cdi_devices.extend(cdi_qualified(x.atom_id) for x in action.held.atoms)
                events.append(r)
            elif isinstance(action, Bind):
                a = action.assignment
                bound.add(a.allocation_id)
                r = self._report(a.allocation_id, a.reservation_id, generation, Report.BOUND)
                r.cdi_devices.extend(cdi_qualified(ref.atom_id) for ref in a.devices)
                events.append(r)
        keep = (set(held) - released) | bound
        await self._remove_orphan_env_files(keep)
        await self._slices.sweep(_slices_kept(actions, held, released))

        if write_errors:
            return SectionResult(FAILED, REASON_WRITE_FAILED, "; ".join(write_errors), events, terminal=False)
        if failures:
            return SectionResult(FAILED, REASON_FAILED, "; ".join(failures), events, terminal=True)
        return SectionResult(CONVERGED, events=events)

    async def _adopt(self, kept: dict[str, cdi.HeldSpec]) -> SectionResult:
        """No spec: keep every hold as it is, restore its env file from the CDI file, report JournalLost."""
        for aid in sorted(set(kept) - self._adopted):
            log.warning(
                "event=allocation.adopted allocation=%s reservation=%s reason=journal-lost",
                aid,
                kept[aid].reservation_id,
            )
        self._adopted = set(kept)
        for held in kept.values():  # a reboot may have dropped an adopted hold's slice: the file says its limits
            if held.cgroup_parent and held.limits is not None:
                try:
                    await self._slices.ensure(held.cgroup_parent, held.limits, force=False)
                except OSError as e:
                    log.warning("event=slice.failed slice=%s error=%r", held.cgroup_parent, str(e))
        await self._restore_env_files(kept)
        await self._remove_orphan_env_files(set(kept))
        return adoption.adopted_status(kept, self.cdi_dir)

    def _report(
        self,
        allocation_id: str,
        reservation_id: str,
        generation: int,
        kind: Any,
        *,
        reason: str = "",
        message: str = "",
    ) -> Report:
        return Report(
            node_id=self.node_id,
            allocation_id=allocation_id,
            reservation_id=reservation_id,
            kind=kind,
            generation=generation,
            reason=reason,
            message=message,
        )

    async def _apply_slice(self, action: Action) -> None:
        """A bound hold's slice before its CDI file names it; a held one's again when missing or changed."""
        if isinstance(action, Bind) and action.slice:
            await self._slices.ensure(action.slice, action.limits, force=True)
        elif isinstance(action, Refresh) and action.slice:
            changed = action.doc is not None and action.held.doc != action.doc
            await self._slices.ensure(action.slice, action.limits, force=changed)

    def _scan(self) -> tuple[dict[str, cdi.HeldSpec], str | None]:
        """What the CDI directory holds (blocking: through self.offload)."""
        mps = str(self.mps_pipe_dir) if self.mps_pipe_dir.is_dir() else None
        held = cdi.read_holds(self.cdi_dir)
        if self.instance_bookings is not None:
            for aid, booking in self.instance_bookings.read().items():
                held.setdefault(aid, booking)  # a CDI file of the same allocation wins: it is what a runtime sees
        return held, mps

    async def _apply(self, action: Action) -> None:
        if self.instance_bookings is not None and _is_instance(action):
            await self._apply_instance(self.instance_bookings, action)
            return
        if isinstance(action, Release):
            # The CDI file is the hold: once it is gone the release happened. An env file left behind
            # (a crash, a failed unlink) is an orphan the end of every pass removes.
            await self.files.remove("cdi", action.held.allocation_id)
            try:
                await self.files.remove("allocation-env", action.held.allocation_id)
            except OSError as e:
                log.warning("event=allocation.env_remove_failed allocation=%s error=%r", action.held.allocation_id, e)
        elif isinstance(action, Bind):
            # The env file first: the CDI file commits the hold, and the hold's env is then already there.
            aid = action.assignment.allocation_id
            await self.files.write("allocation-env", aid, env_files.env_bytes(aid, action.env))
            await self.files.write("cdi", aid, cdi.spec_bytes(action.doc))
        elif isinstance(action, Refresh) and action.doc is not None:
            aid = action.assignment.allocation_id
            await self._write_env_if_changed(aid, action.env)
            if action.held.doc != action.doc:
                await self.files.write("cdi", aid, cdi.spec_bytes(action.doc))

    async def _apply_instance(self, bookings: InstanceBookings, action: Action) -> None:
        """A booking record written or removed: no CDI file, no env file, no slice."""
        if isinstance(action, Release):
            await bookings.remove(action.held.allocation_id)
        elif isinstance(action, (Bind, Refresh)) and action.doc is not None and _changed(action):
            await bookings.write(action.assignment.allocation_id, action.doc)

    async def _write_env_if_changed(self, allocation_id: str, lines: Sequence[str]) -> None:
        want = env_files.env_bytes(allocation_id, lines)
        have = await self.offload(_read_or_none, env_files.env_path(self.env_dir, allocation_id))
        if have != want:
            await self.files.write("allocation-env", allocation_id, want)

    async def _restore_env_files(self, kept: Mapping[str, cdi.HeldSpec]) -> None:
        """An adopted hold's env file, as its CDI file says (files under /run are gone after a reboot)."""
        for aid, held in kept.items():
            lines = (held.doc.get("containerEdits") or {}).get("env")
            if not isinstance(lines, list) or not all(isinstance(x, str) and "\n" not in x for x in lines):
                continue  # not a file we wrote as it is now: leave its env file alone
            try:
                await self._write_env_if_changed(aid, lines)
            except OSError as e:
                log.warning("event=allocation.env_restore_failed allocation=%s error=%r", aid, str(e))

    async def _remove_orphan_env_files(self, keep: set[str]) -> None:
        """Our env files whose hold no longer exists (a crash between the two removals of a release).

        Only files the agent provably wrote (`env_files.ours`: name and marker): the env dir may be shared.
        """
        for aid, f in (await self.offload(env_files.ours, self.env_dir)).items():
            if aid not in keep:
                try:
                    await self.files.remove("allocation-env", aid)
                except OSError as e:
                    log.warning("event=allocation.env_orphan path=%s error=%r", f, str(e))


def _read_or_none(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _conflicts_with(action: Bind, atoms: Sequence[Atom]) -> bool:
    mine = [parse_atom(ref.device_class, ref.atom_id) for ref in action.assignment.devices]
    return any(atoms_conflict(x, y) for x in mine for y in atoms)


def _slices_kept(actions: Sequence[Action], held: Mapping[str, cdi.HeldSpec], released: set[str]) -> set[str]:
    """The slices this pass keeps: every desired hold's, and every hold's still on disk (as its file says)."""
    kept = {a.slice for a in actions if isinstance(a, (Bind, Refresh)) and a.slice}
    kept.update(h.cgroup_parent for aid, h in held.items() if aid not in released and h.cgroup_parent)
    return kept


def _changed(action: Bind | Refresh) -> bool:
    return isinstance(action, Bind) or action.held.doc != action.doc


def _is_instance(action: Action) -> bool:
    if isinstance(action, Release):
        return action.held.instance
    if isinstance(action, Fail):
        return False
    return action.assignment.binding == spec_pb2.BINDING_INSTANCE


def _allocation_of(action: Action) -> str:
    return action.held.allocation_id if isinstance(action, Release) else action.assignment.allocation_id
