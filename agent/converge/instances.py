"""The `instances` section: the VMs this host should run, over the runtimes it has (docs/instances.md).

One pass:

1. List every runtime's domains. A domain bc did not create is reported and
   never touched; a spec instance with its id fails ("not bc's").
2. Check each spec instance again (bc.protocol.instance_rules: a node never
   trusts that the server checked), find its runtime and its boot files in
   `<data-dir>/instance-boot/`; a problem fails that instance only.
3. Plan each instance (agent.instances.plan). Domains of bc's that no spec
   names are deleted. Stops, pauses, deletes and plain defines run first, so
   what they free counts for the starts; then starts and resumes, in spec
   order, each start through host admission (agent.instances.admission),
   counting the live domains, the bound holds' memory limits and the starts
   admitted before it in this pass.
4. Report: `statuses` (StatusReport.instances) lists every domain, bc's with
   the spec's desired state and a message, foreign ones as `managed: false`.

A runtime call that fails marks that instance `ERROR` with its message and
the pass carries on with the others; the section is then FAILED with reason
`InstanceFailed` (terminal for the generation; the next pass tries again). A
start admission refuses leaves the instance stopped with `ResourcesExhausted:
… MiB needed, … MiB left`: not an error, the section stays PROGRESSING and the
next pass tries again. After a host reboot every domain is stopped, and the
plan starts the ones that should run.

User data (`user_data_secret_ref`, docs/instances.md): just before it starts
an instance that names a secret, the converger asks the broker for it, bound
to the instances section at this generation (agent.converge.secret_port),
writes it to the instance's 0600 file on tmpfs (agent.instances.user_data)
and hands the runtime the path. While the broker cannot answer the instance
is not started (`SecretUnavailable`, the section PROGRESSING); a refusal
fails that instance only (ERROR with the reason). The file is removed when the
instance stops or is deleted, or is found stopped; a rotated secret reaches the guest at its next
start.

GPU passthrough (`gpus`, agent.instances.passthrough): each pass resolves an
instance's GPUs against the spec's devices section and the node's bookings
(a GPU it may not have fails that instance), binds their IOMMU groups to
vfio-pci just before a start and hands them back after a stop or delete, and
at the end of the pass from every instance no longer running or paused.
`InstanceStatus.gpus` lists the GPUs passed through to each instance.

Networks (agent.instances.net): before any start, the pass loads the nftables rules for every checked
instance's NICs (a deleted one's too, until its domain is gone). An instance whose network policy breaks a
rule, or whose rules did not load, fails (ERROR) and is stopped if it runs, so no guest runs outside its rules.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from google.protobuf.message import Message

from agent.converge import instance_restore as restore
from agent.converge.instance_disks import REASON_IMAGE_PENDING, InstanceDisks
from agent.converge.instance_rebind import Rebinder
from agent.converge.run import CONVERGED, FAILED, PROGRESSING, SectionResult
from agent.converge.secret_port import SecretRefused, SecretSource, SecretUnavailable
from agent.instances import placement as placements
from agent.instances import plan as steps
from agent.instances.admission import Admission, HostMemory, commitment_mib
from agent.instances.net import guard as net_guard
from agent.instances.net.names import nic_mac, tap_name
from agent.instances.passthrough import GpuPassthrough
from agent.instances.placement import HostTopology
from agent.instances.runtime import (
    PAUSED,
    RUNNING,
    STOPPED,
    Domain,
    DomainConfig,
    InstanceRuntime,
    NicConfig,
    RuntimeFailure,
)
from agent.instances.snapshots import Restored, Snapshots
from agent.instances.user_data import UserDataFiles
from agent.offload import Offload
from bc.protocol import instance_net_rules, instance_rules
from bc.protocol.pb import common_pb2, spec_pb2

log = logging.getLogger(__name__)

REASON_FAILED = "InstanceFailed"
REASON_EXHAUSTED = "ResourcesExhausted"
REASON_LIST_FAILED = "RuntimeUnavailable"
REASON_SECRET_UNAVAILABLE = "SecretUnavailable"
ERROR = "ERROR"
BOOT_DIR = "instance-boot"


@dataclass
class _Item:
    """One spec instance through the pass."""

    spec: spec_pb2.Instance
    desired: str
    runtime: InstanceRuntime | None
    observed: str
    config: DomainConfig | None = None
    error: str = ""
    refused: str = ""
    waiting: str = ""  # its user data's secret, its image or its snapshot cannot be had now: tried next pass
    restore: str = ""  # the sha256 of the downloaded snapshot its define unpacks (agent.instances.snapshots)
    restored: Restored | None = None  # what it was restored from, once it was
    checked: bool = False  # it passed the rules and is bc's to run: its NICs get network rules
    halt: bool = False  # its network cannot be what the spec says: stopped if it runs


class InstancesConverger:
    section = "instances"

    def __init__(
        self,
        runtimes: Mapping[str, InstanceRuntime],
        boot_dir: Path,
        host_memory: Callable[[], Awaitable[HostMemory | None]],
        holds_memory: Callable[[], list[int]],
        offload: Offload,
        secrets: SecretSource | None = None,
        user_data: UserDataFiles | None = None,
        gpus: GpuPassthrough | None = None,
        topology: Callable[[], Awaitable[HostTopology | None]] | None = None,
        disks: InstanceDisks | None = None,
        snapshots: Snapshots | None = None,
        rebinder: Rebinder | None = None,
        network: net_guard.InstanceNetwork | None = None,
    ) -> None:
        self.runtimes = dict(runtimes)
        self.gpus = gpus
        """VFIO passthrough (None: this node passes no GPU through, and an instance naming one fails)."""
        self.network = network
        """The host's network rules for the instances' NICs (None: a host that loads none, as --fake-hw)."""
        self.disks = disks
        """Tenant images, root overlays and volumes (agent.converge.instance_disks); None: kernels only."""
        self.topology = topology
        self._topo: HostTopology | None = None
        self._hugepage_mib: dict[str, int] = {}
        self.balloon_mib: dict[str, int] = {}
        """What each guest's balloon takes now (the balloon controller's, reported as balloon_mib)."""
        self._ballooned: list[tuple[str, str, int]] = []
        self.snapshots = snapshots
        self.rebinder = rebinder
        self.secrets = secrets
        self.user_data = user_data
        self.boot_dir = boot_dir
        self.host_memory = host_memory
        self.holds_memory = holds_memory
        self.offload = offload
        self.statuses: list[common_pb2.InstanceStatus] = []
        """The last pass's report of every domain (StatusReport.instances)."""
        self.complete = False
        """Whether every runtime answered the last pass's listing."""

    def committed_mib(self) -> int:
        """What bc's running and paused VMs commit after the last pass (memory + overhead each): what the
        devices converger's hold admission leaves to them (reference: VMs and holds count each other)."""
        return sum(
            commitment_mib(s.memory_mib, self._hugepage_mib.get(s.id, 0))
            for s in self.statuses
            if s.managed and s.state in (RUNNING, PAUSED)
        )

    def ballooned(self) -> list[tuple[str, str, int]]:
        """The running guests of bc's whose placement asks for a balloon, after the last pass: (runtime, id,
        memory MiB), for the balloon controller."""
        return list(self._ballooned)

    async def _list(self) -> tuple[dict[str, tuple[str, Domain]], list[str]]:
        found: dict[str, tuple[str, Domain]] = {}
        problems: list[str] = []
        for name, rt in sorted(self.runtimes.items()):
            try:
                for d in await rt.list():
                    found.setdefault(d.id, (name, d))
            except RuntimeFailure as e:
                problems.append(f"runtime {name}: {e}")
        return found, problems

    async def _config(self, inst: spec_pb2.Instance) -> DomainConfig:
        kernel = self.boot_dir / inst.kernel if inst.kernel else None
        initrd = self.boot_dir / inst.initrd if inst.initrd else None
        for what, path in (("kernel", kernel), ("initrd", initrd)):
            if path is not None and not await self.offload(path.is_file):
                raise RuntimeFailure(f"the {what} {path.name!r} is not in {self.boot_dir}")
        nics = tuple(
            NicConfig(tap_name(inst.id, i), n.bridge, nic_mac(inst.id, i, n.mac)) for i, n in enumerate(inst.nics)
        )
        placed = placements.resolve(inst.placement if inst.HasField("placement") else None, inst.vcpus, self._topo)
        config = DomainConfig(
            inst.id,
            inst.vcpus,
            inst.memory_mib,
            kernel,
            initrd,
            inst.cmdline,
            allocation_id=inst.allocation_id,
            nics=nics,
            placement=placed,
        )
        if self.disks is not None:
            disk, volumes = self.disks.config(inst)
            config = dataclasses.replace(
                config, disk=disk[0] if disk else None, disk_base=disk[1] if disk else None, volumes=volumes
            )
        elif inst.image or inst.volumes:
            raise RuntimeFailure("this agent keeps no tenant images or volumes")
        return config

    async def _prepare(self, inst: spec_pb2.Instance, domains: dict[str, tuple[str, Domain]]) -> _Item:
        item = _Item(inst, instance_rules.desired_state(inst), self.runtimes.get(inst.runtime), steps.ABSENT)
        try:
            instance_rules.check_instance(inst)
        except instance_rules.InstanceRuleError as e:
            item.error = f"the spec's {e}"
            item.halt = instance_net_rules.is_network_field(e.field)
            held = domains.get(inst.id) if item.halt else None
            if held is not None and held[1].managed:  # bc's guest runs on: its network cannot be what it says
                item.runtime, item.observed = self.runtimes[held[0]], held[1].state
            return item
        if item.runtime is None:
            item.error = f"runtime {inst.runtime} is not installed on this host"
            return item
        held = domains.get(inst.id)
        if held is not None:
            name, d = held
            if not d.managed:
                item.error = f"a domain bc did not create is named {inst.id} (runtime {name}); it is left alone"
                return item
            if name != inst.runtime:
                item.error = f"domain {inst.id} runs on runtime {name}, not {inst.runtime}"
                return item
            item.observed = d.state
        item.checked = True
        if item.desired != instance_rules.DELETED:
            try:
                item.config = await self._config(inst)
                if inst.gpus:
                    item.config = dataclasses.replace(item.config, gpus=await self._gpu_addresses(inst))
            except RuntimeFailure as e:
                item.error = str(e)
            if inst.HasField("restore_from") and item.config is not None:
                await restore.prepare(self.snapshots, item)
        return item

    async def _apply_network(self, items: list[_Item]) -> list[str]:
        """Load the network rules for every checked instance whose domain is or will be there (a deleted one
        keeps its guard until its domain is gone), before any start; fail the instances whose network
        cannot be what the spec says and stop those that run. The ids it stopped."""
        kept = [
            i for i in items if i.checked and not (i.desired == instance_rules.DELETED and i.observed == steps.ABSENT)
        ]
        failed = await net_guard.failures(self.network, [i.spec for i in kept])
        stopped: list[str] = []
        for item in items:
            why = failed.get(item.spec.id)
            if why is not None and not item.error:
                item.error, item.halt = why, True
            if item.halt and item.observed in (RUNNING, PAUSED) and item.runtime is not None:
                try:
                    await item.runtime.stop(item.spec.id)
                except RuntimeFailure as e:
                    item.error += f"; stop: {e}"
                    continue
                await self._forget_user_data(item.spec.id)
                item.observed = STOPPED
                stopped.append(item.spec.id)
                log.warning("event=instance.stop instance=%s reason=network error=%r", item.spec.id, item.error)
        return stopped

    async def _gpu_addresses(self, inst: spec_pb2.Instance) -> tuple[str, ...]:
        if self.gpus is None:
            raise RuntimeFailure("this node passes no GPU through (no VFIO)")
        return await self.gpus.resolve(inst)

    async def _user_data(self, item: _Item, generation: int) -> Path | None:
        """The user data file for this start (None: the instance names none), or item.waiting / item.error set
        and RuntimeFailure raised: the start does not happen."""
        inst = item.spec
        ref = inst.user_data_secret_ref
        if not ref:
            if self.user_data is not None:
                await self.user_data.drop(inst.id)
            return None
        if self.secrets is None or self.user_data is None:
            item.error = f"its user data is the secret {ref!r}, and this agent has no secret broker"
            raise RuntimeFailure(item.error)
        try:
            value = await self.secrets.get(ref, self.section, generation, allocation_id=inst.allocation_id)
        except SecretUnavailable as e:
            item.waiting = f"{REASON_SECRET_UNAVAILABLE}: user data {ref!r}: {e}"
            raise RuntimeFailure(item.waiting) from None
        except SecretRefused as e:
            item.error = f"user data {ref!r} refused: {e.reason}: {e.message}"
            raise RuntimeFailure(item.error) from None
        try:
            return await self.user_data.put(inst.id, value)
        except OSError as e:
            item.error = f"cannot write its user data under {self.user_data.directory}: {e.strerror}"
            raise RuntimeFailure(item.error) from None

    async def _forget_user_data(self, instance_id: str) -> None:
        if self.user_data is not None:
            await self.user_data.drop(instance_id)

    async def _run(self, item: _Item, step: str, user_data: Path | None = None) -> None:
        rt, iid = item.runtime, item.spec.id
        assert rt is not None
        if step == steps.DEFINE:
            assert item.config is not None
            await rt.define(item.config)
            if item.restore:
                await restore.unpack(self.snapshots, rt, item)
        elif step in steps.STARTS:
            try:
                if self.gpus is not None and item.config is not None:
                    await self.gpus.attach(iid, tuple(item.spec.gpus), item.config.gpus)
                await rt.start(iid, paused=step == steps.START_PAUSED, user_data=user_data)
            except RuntimeFailure:
                await self._forget_user_data(iid)
                if self.gpus is not None:
                    await self.gpus.detach(iid)
                raise
        elif step == steps.PAUSE:
            await rt.pause(iid)
        elif step == steps.RESUME:
            await rt.resume(iid)
        elif step == steps.STOP:
            await rt.stop(iid)
            await self._forget_user_data(iid)
            await self._hand_back(iid)
            if self.disks is not None:
                self.disks.release(iid)
        elif step == steps.DELETE:
            await rt.delete(iid)
            await self._forget_user_data(iid)
            await self._hand_back(iid)
            if self.disks is not None:
                await self.disks.forget(iid)
        item.observed = steps.apply(item.observed, step)
        log.info("event=instance.%s instance=%s state=%s", step, iid, item.observed)

    async def _hand_back(self, instance_id: str) -> None:
        if self.gpus is not None:
            await self.gpus.detach(instance_id)

    async def _steps(self, item: _Item, todo: tuple[str, ...], ledger: Admission | None, generation: int) -> None:
        for step in todo:
            user_data: Path | None = None
            if step == steps.DEFINE and self.disks is not None:
                try:
                    item.waiting = await self.disks.image_waiting(item.spec)
                except RuntimeFailure as e:
                    item.error = f"image: {e}"
                    return
                if item.waiting:  # "ImagePending: …"
                    return
            if step in steps.STARTS:
                try:
                    user_data = await self._user_data(item, generation)
                except RuntimeFailure:
                    log.warning(
                        "event=instance.user-data-withheld instance=%s ref=%s waiting=%s",
                        item.spec.id,
                        item.spec.user_data_secret_ref,
                        bool(item.waiting),
                    )
                    return
            placed = item.config.placement if item.config is not None else None
            hugepage_mib, mems = (placed.hugepage_mib, placed.mems) if placed is not None else (0, ())
            if step in steps.STARTS and ledger is not None:
                refusal = ledger.admit(item.spec.id, item.spec.memory_mib, hugepage_mib, mems)
                if refusal is not None:
                    item.refused = refusal
                    log.warning("event=instance.not-admitted instance=%s %s", item.spec.id, refusal)
                    await self._forget_user_data(item.spec.id)
                    return
            if step in steps.STARTS and self.disks is not None:
                why = self.disks.claim(item.spec)  # one writer per volume: the first in spec order keeps it
                if why:
                    item.error = f"{step}: {why}"
                    log.warning("event=instance.volume-refused instance=%s %s", item.spec.id, why)
                    if ledger is not None:
                        ledger.release(item.spec.memory_mib)
                    await self._forget_user_data(item.spec.id)
                    return
            try:
                await self._run(item, step, user_data)
                if step == steps.DEFINE and self.disks is not None:
                    try:
                        await self.disks.prepare_root(item.spec)
                    except RuntimeFailure as e:
                        item.error = f"disk: {e}"
                        log.warning("event=instance.failed instance=%s step=disk error=%r", item.spec.id, str(e))
                        return
            except RuntimeFailure as e:
                if step in steps.STARTS and self.disks is not None:
                    self.disks.release(item.spec.id)
                if step in steps.STARTS and ledger is not None:
                    ledger.release(item.spec.memory_mib, hugepage_mib, mems)
                item.error = f"{step}: {e}"
                log.warning("event=instance.failed instance=%s step=%s error=%r", item.spec.id, step, str(e))
                return

    async def converge(self, desired: Message, generation: int) -> SectionResult:
        assert isinstance(desired, spec_pb2.InstancesSection)
        domains, problems = await self._list()
        self.complete = not problems
        if problems:  # acting on a partial listing could define over a domain it did not show: wait instead
            return _result([], [], problems)
        self._topo = await self.topology() if self.topology is not None else None
        if self.disks is not None:  # volumes created and grown before any instance is defined
            await self.disks.begin(desired, [d for _, d in domains.values()])
        items = [await self._prepare(inst, domains) for inst in desired.instances]
        if self.secrets is not None and not any(i.user_data_secret_ref for i in desired.instances):
            self.secrets.release(self.section)  # no instance names user data any more: drop what is held
        named = {i.spec.id for i in items}
        orphan_errors: list[tuple[Domain, str]] = []
        live: dict[str, tuple[int, int]] = {}  # the running and paused domains of bc's: (memory, huge page size)
        for name, d in domains.values():
            if not d.managed:
                continue
            if d.id not in named:  # bc's, and no spec names it any more: deleted
                try:
                    await self.runtimes[name].delete(d.id)
                    await self._forget_user_data(d.id)
                    await self._hand_back(d.id)
                    if self.disks is not None:
                        await self.disks.forget(d.id)
                    log.info("event=instance.delete instance=%s reason=unnamed", d.id)
                except RuntimeFailure as e:
                    orphan_errors.append((d, f"delete: {e}"))
                    if d.state in (RUNNING, PAUSED):
                        live[d.id] = (d.memory_mib, d.hugepage_mib)
            elif d.state in (RUNNING, PAUSED):
                live[d.id] = (d.memory_mib, d.hugepage_mib)
        for iid in await self._apply_network(items):  # before any start: no guest runs outside its rules
            live.pop(iid, None)
        plans = {id(i): steps.plan(i.desired, i.observed) for i in items if not i.error and not i.waiting}
        # Stops, pauses, deletes and defines first: what they free counts for the starts.
        for item in items:
            todo = plans.get(id(item), ())
            if todo and not (set(todo) & (steps.STARTS | {steps.RESUME})):
                await self._steps(item, todo, None, generation)
                if item.observed in (STOPPED, steps.ABSENT):
                    live.pop(item.spec.id, None)
        host = await self.host_memory()
        if self.topology is not None and any(set(plans.get(id(i), ())) & steps.STARTS for i in items):
            # read again: the stops and deletes above gave their huge pages back
            self._topo = await self.topology() or self._topo
        pools = self._topo.hugepages if self._topo is not None else None
        ledger = Admission.for_pass(host, list(live.values()), self.holds_memory(), pools) if host is not None else None
        if host is None and any(set(plans.get(id(i), ())) & steps.STARTS for i in items):
            log.warning("event=instance.admission-skipped reason=host memory unknown")
        for item in items:
            todo = plans.get(id(item), ())
            if set(todo) & (steps.STARTS | {steps.RESUME}):
                await self._steps(item, todo, ledger, generation)
        if self.disks is not None:
            await self._disks_after(items)
        for item in items:  # a guest that powered itself off (or a host reboot) leaves its file: not for long
            if item.observed in (STOPPED, steps.ABSENT) and item.spec.user_data_secret_ref:
                await self._forget_user_data(item.spec.id)
        if self.gpus is not None:  # a VM that is not running or paused holds no GPU: hand back what it had
            running = {i.spec.id for i in items if i.observed in (RUNNING, PAUSED)}
            running |= {d.id for d, _ in orphan_errors if d.state in (RUNNING, PAUSED)}
            await self.gpus.keep_only(running)
        self._hugepage_mib = {i.spec.id: i.config.placement.hugepage_mib for i in items if i.config is not None}
        self._hugepage_mib |= {d.id: d.hugepage_mib for _, d in domains.values() if d.id not in self._hugepage_mib}
        self._ballooned = [
            (i.spec.runtime, i.spec.id, i.spec.memory_mib)
            for i in items
            if i.config is not None and i.config.placement.balloon and i.observed == RUNNING and not i.error
        ]
        self.statuses = self._report(items, domains, orphan_errors)
        if self.gpus is not None:
            attached = await self.gpus.attached()
            for s in self.statuses:
                if s.managed and s.id in attached:
                    s.gpus.extend(attached[s.id].gpus)
        await restore.after_pass(self.snapshots, self.rebinder, items, self.statuses, generation)
        return _result(items, orphan_errors, problems)

    async def _disks_after(self, items: list[_Item]) -> None:
        """Live attach and detach on running and paused domains, then the volumes no one lists go."""
        assert self.disks is not None
        for item in items:
            if item.error or item.runtime is None or item.observed not in (RUNNING, PAUSED):
                continue
            try:
                why = await self.disks.live(item.spec, item.runtime)
            except RuntimeFailure as e:
                why = str(e)
            if why:
                item.error = why
                log.warning("event=instance.volumes-failed instance=%s error=%r", item.spec.id, why)
        for item in items:  # a guest that powered itself off has let go of its volumes
            if item.observed in (STOPPED, steps.ABSENT) and not item.error:
                self.disks.release(item.spec.id)
        await self.disks.end()

    def _report(
        self, items: list[_Item], domains: dict[str, tuple[str, Domain]], orphans: list[tuple[Domain, str]]
    ) -> list[common_pb2.InstanceStatus]:
        out: list[common_pb2.InstanceStatus] = []
        for item in items:
            if item.observed == steps.ABSENT and not item.error and not item.refused and not item.waiting:
                continue  # deleted, or never defined (DELETED): nothing to show
            state = ERROR if item.error else (STOPPED if item.observed == steps.ABSENT else item.observed)
            out.append(
                common_pb2.InstanceStatus(
                    id=item.spec.id,
                    runtime=item.spec.runtime,
                    state=state,
                    desired=item.desired,
                    message=item.error or item.refused or item.waiting,
                    managed=True,
                    vcpus=item.spec.vcpus,
                    memory_mib=item.spec.memory_mib,
                    volumes=self.disks.open.of(item.spec.id) if self.disks is not None else [],
                    image_sha256=self.disks.image_sha256(item.spec) if self.disks is not None else "",
                    balloon_mib=self.balloon_mib.get(item.spec.id, 0) if item.observed == RUNNING else 0,
                )
            )
        for d, why in orphans:
            out.append(_domain_status(domains, d, ERROR, why))
        for _name, d in domains.values():
            if not d.managed:
                out.append(_domain_status(domains, d, d.state, ""))
        return sorted(out, key=lambda s: (not s.managed, s.id))


def _domain_status(
    domains: dict[str, tuple[str, Domain]], d: Domain, state: str, message: str
) -> common_pb2.InstanceStatus:
    return common_pb2.InstanceStatus(
        id=d.id,
        runtime=domains[d.id][0],
        state=state,
        message=message,
        managed=d.managed,
        vcpus=d.vcpus,
        memory_mib=d.memory_mib,
    )


def _result(items: list[_Item], orphans: list[tuple[Domain, str]], problems: list[str]) -> SectionResult:
    failed = [f"instance {i.spec.id}: {i.error}" for i in items if i.error]
    failed += [f"instance {d.id}: {why}" for d, why in orphans]
    refused = [f"instance {i.spec.id}: {i.refused}" for i in items if i.refused]
    waiting = [f"instance {i.spec.id}: {i.waiting}" for i in items if i.waiting]
    if problems:
        return SectionResult(FAILED, reason=REASON_LIST_FAILED, message="; ".join(problems + failed))
    if failed:
        message = "; ".join(failed + refused + waiting)
        return SectionResult(FAILED, reason=REASON_FAILED, message=message, terminal=not (refused or waiting))
    if waiting:
        secret = any(i.waiting.startswith(REASON_SECRET_UNAVAILABLE) for i in items)
        image = any(i.waiting.startswith(REASON_IMAGE_PENDING) for i in items)
        reason = (
            REASON_SECRET_UNAVAILABLE if secret else REASON_IMAGE_PENDING if image else restore.REASON_SNAPSHOT_PENDING
        )
        return SectionResult(PROGRESSING, reason=reason, message="; ".join(waiting + refused))
    if refused:
        return SectionResult(PROGRESSING, reason=REASON_EXHAUSTED, message="; ".join(refused))
    return SectionResult(CONVERGED)
