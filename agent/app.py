"""`bc node`: the agent's wiring. One asyncio process per host.

`Agent` is built from `AgentOptions` (what the operator said) and
`AgentParts` (everything it reads the world through: the clock, one seeded
`random.Random`, the identity, the hardware backend, the journal, `dial()`
and where blocking calls run). `production_parts` builds the real ones; the
simulator and tests build their own (a virtual-time loop's clock, a Random
from the seed, `MemoryJournal`, a `bc.seams.network` dial, fake hardware, inline offload),
and nothing in the agent can tell.

Three loops share the agent's state (`agent.session.node_state.NodeState`):

* the session loop (`agent.session.dialing`) dials through `dial()`, runs one
  session at a time through the I/O-free core, and redials with full-jitter
  back-off (0–1 s, doubling to 60 s); a close whose typed reason says the
  certificate is done (revoked, an older identity) stops the agent;
* the converge loop applies the spec held in the journal, section by section,
  on every new spec and every 10 s (the drift pass, which also re-reads the
  holds from the CDI directory), journals what it observed, and puts the
  newest status report in the outbox (latest wins);
* the renewal loop (`agent/renewal.py`) renews the node certificate at 60 % of
  its life and then rotates the session, so the redial presents the new one.

A node joined with `--attestor tpm` holds its node key in the TPM, which
grpcio's TLS cannot use: a fourth loop (`agent.session_key`) keeps a session
key in memory, certified by `Join.SessionCert` with a proof of the TPM key, and
the session's TLS, the results' signatures and the dial run on it; the node
certificate renews by proof (`Renewer(by_proof=True)`), its next key made in
the TPM, and allocation reports are signed in the TPM.

The spec is enforced from the journal whether or not a gateway is reachable.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import random
import shutil
import signal
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.converge.access import access_converger
from agent.converge.daemon import DaemonConverger
from agent.converge.devices import DevicesConverger
from agent.converge.host import ExternallyManaged, HostConverger
from agent.converge.host_ops import HoldFiles
from agent.converge.host_wiring import device_nodes, host_converger
from agent.converge.instance_disks import instance_disks
from agent.converge.instance_snapshots import snapshot_parts
from agent.converge.instances import BOOT_DIR, InstancesConverger
from agent.converge.run import Converger, UnknownFieldsMemo, run
from agent.dispatch import Dispatcher
from agent.health.monitor import HealthMonitor
from agent.health.readings import HealthSource
from agent.helper.client import HelperClient
from agent.helper.node_ops import HelperXids
from agent.helper.node_tpm import open_tpm
from agent.helper.vm_client import HelperNetwork, HelperVmm
from agent.helper.wiring import HelperSeams, helper_seams
from agent.hw import open_backend
from agent.hw.base import HardwareBackend, inventory_hash
from agent.hw.slices import SliceManager, open_slices
from agent.identity import Identity, IdentityFile, IdentityStore
from agent.instances import gpu_wiring
from agent.instances.admission import HostMemory, parse_meminfo
from agent.instances.balloon import DEFAULT_FLOOR_PERCENT, HostPressure, parse_pressure
from agent.instances.balloon_control import BalloonController
from agent.instances.fake import FakeRuntime
from agent.instances.libvirt import DEFAULT_URI as LIBVIRT_URI
from agent.instances.libvirt import open_runtime as open_libvirt
from agent.instances.net.guard import RESTORED_EVENT, InstanceNetwork
from agent.instances.net.taps import NetlinkTaps
from agent.instances.placement import HostTopology, fake_topology, read_topology
from agent.instances.qemu import QEMU, QemuRuntime
from agent.instances.runtime import InstanceRuntime
from agent.instances.user_data import UserDataFiles
from agent.journal import Journal
from agent.journal_api import AgentJournal, JournalFull
from agent.journal_rules import fit_update_message
from agent.key_holder import FileNodeKey, NodeKeyHolder
from agent.kinds import executor_for
from agent.kinds.base import KindContext, KindExecutor
from agent.kinds.upload_allow import parse_prefixes
from agent.node_key import NodeKey
from agent.offload import Offload, to_thread
from agent.quorum import QuorumCheck, UnbatchedAllowance
from agent.ramdisk.kexec import Kexec
from agent.ramdisk.machine import MachineTree
from agent.ramdisk.wiring import ramdisk_parts
from agent.renewal import Renewer
from agent.secrets import SecretClient, SecretUnavailable
from agent.session.channels import MemoryPair, PairSource
from agent.session.dialing import Dial, SessionLoop
from agent.session.grpc_dial import grpc_dial
from agent.session.node_state import NodeState
from agent.session.outbox import Outbox
from agent.session.runner import CAPABILITIES, SessionDeps
from agent.session_core import SpecRule, decide_spec
from agent.session_key import SessionKeys
from agent.site.converger import SiteConverger
from agent.site.role import site_executors
from agent.site.state import SiteOptions, SiteState
from agent.telemetry.converger import TelemetryConverger
from agent.telemetry.loop import TelemetryLoop
from agent.telemetry.metrics import AgentMetrics, Gauges
from agent.tpm import TpmNodeKey, TpmRecord
from agent.trust import AgentTrust
from agent.tunnel.service import TunnelService
from agent.upgrade.controller import UpgradeConfig, Upgrader, UpgradeRefused, restart_process
from agent.upgrade.slots import Slots, SlotStore
from bc.errors import BcError, Conflict, Unauthenticated, UsageError
from bc.pki import attest
from bc.pki.quorum import CountApprovals, count_approvals
from bc.pki.secrets_source import os_seeded_random
from bc.protocol.limits import LIMITS
from bc.protocol.pb import common_pb2, session_pb2
from bc.protocol.pb.session_pb2 import CommandUpdate
from bc.runtime.aio import cancel_and_wait, wait_event
from bc.runtime.version import bc_version, test_never_dial
from bc.seams.clock import Clock, SystemClock
from bc.seams.link import Link

log = logging.getLogger("agent")

DRIFT_PASS_S = 10.0
HEALTH_PASS_S = 2.0
"""How often the health monitor reads the GPUs: a changed condition starts a converge pass, which reports it."""


@dataclass
class AgentOptions:
    data_dir: Path
    fake_hw: str | None = None
    cdi_dir: Path | None = None
    env_dir: Path | None = None
    heartbeat_interval_s: float | None = None
    allow_gpu_reset: bool = False
    allow_reboot: bool = False
    upload_allow: tuple[str, ...] = ()
    """`--upload-allow` URL prefixes: where logs.collect may upload (agent.kinds.upload_allow); none: nowhere."""
    fake_faults: tuple[str, ...] = ()
    """`--fake-fault KIND:GPU` faults the fake hardware shows from the start (agent.hw.fake_faults)."""
    host_root: Path | None = None
    """`--host-root`: where the host units' files go (default `/`; `<data dir>/host-root` on fake hardware)."""
    host_units: bool = True
    instance_accel: tuple[str, ...] = ("kvm", "tcg")
    balloon_floor_percent: int = DEFAULT_FLOOR_PERCENT
    instance_runtime: str = "auto"  # auto | fake | qemu
    instance_stop_grace_s: float = 60.0  # the ACPI power button's time before a VM is ended
    libvirt_uri: str = LIBVIRT_URI
    """`--libvirt-uri`: the libvirt connection the `libvirt` runtime uses where it answers; empty: none."""
    """`--instance-accel`: the accelerators qemu tries in order for the instances section's VMs."""
    """False (`--no-host-units`): the host section is managed outside bc (agent.converge.host_wiring)."""
    ssh_dir: Path | None = None
    """`--ssh-dir`: the access section's sshd files (agent.converge.access); default `<data-dir>/ssh`."""
    sshd_reload_cmd: str | None = None
    """`--sshd-reload-cmd`, split like a shell would; None: `systemctl reload ssh`, or nothing under --fake-hw."""
    sshd_config: Path | None = None
    """`--sshd-config`: what `sshd -t -f` checks (it must include the drop-in); default /etc/ssh/sshd_config."""
    install_dir: Path | None = None
    """The A/B install dir (agent.upgrade.slots) this agent runs from; None: a zipapp or checkout, no self-update."""
    upgrade: UpgradeConfig = dataclasses.field(default_factory=UpgradeConfig)
    """Self-update: the confirmation deadline and the download's stall guard."""
    helper_socket: Path | None = None
    """`--helper-socket`: an unprivileged node's root effects go through `bc helper` there (agent.helper);
    None: the agent does them itself (as root, or under --fake-hw)."""
    drift_pass_s: float = DRIFT_PASS_S
    """How often the converge pass re-reads the host when nothing changed (drift); a spec change runs it at once."""
    tcti: str | None = None
    """`--tcti`: how a TPM identity reaches its TPM (default `device:/dev/tpmrm0`, agent.tpm)."""
    site: SiteOptions = dataclasses.field(default_factory=SiteOptions)
    """A site agent's own settings (`--site-bmc-network`; agent.site.state); unused by other roles."""
    machine_root: Path | None = None
    """`--machine-root`: where a ramdisk reads /sys, /proc and /dev (agent.ramdisk.machine); default `/`."""


@dataclass
class AgentParts:
    """Everything the agent reads the world through, passed in (ARCHITECTURE.md §3)."""

    clock: Clock
    rng: random.Random
    """The one Random: incarnation and journal ids, back-off, renewal jitter, fake boot ids. Not for secrets."""
    identity: Identity
    ca_pem: bytes
    """The cluster CA's certificate, read once before the loop."""
    identity_store: IdentityStore
    node_key: NodeKey
    hw: HardwareBackend
    dial: Dial
    open_journal: Callable[[], Awaitable[AgentJournal]]
    offload: Offload = to_thread
    renewal: bool = True
    """Run the renewal loop (gRPC `Join.Renew` with the identity files); the simulator runs without."""
    slices: SliceManager | None = None
    """The hold slice seam (agent.hw.slices); left out: files under the data dir on fake hardware, else systemd."""
    health: HealthSource | None = None
    """Where GPU and host health is read (agent.health); left out: no health monitor, no conditions."""
    telemetry: bool = False
    """Converge the `telemetry` section and export over OTLP; off under the simulator (the section is UNSUPPORTED)."""
    secrets: bool = False
    """Ask the secret broker for the secrets a spec names (agent.secrets); off under the simulator."""
    version: str = ""
    """The version this binary claims (empty: bc.runtime.version.bc_version()); a self-update never trusts it."""
    devices_converger: type[DevicesConverger] = DevicesConverger
    """The devices section's converger class (a seam: `bc sim --break` swaps in a broken one)."""
    restart: Callable[[], Awaitable[None]] | None = None
    """How a self-update starts `current` again; left out: re-exec (fake hardware, no systemd) or exit 75."""
    spec_rule: SpecRule = decide_spec
    """Which delivered spec the sessions apply (agent.session_core); the simulator's `--break` hands a broken one."""
    quorum_count: CountApprovals = count_approvals
    """How a destructive batch command's approvals are counted against k (agent.quorum.check_batch); the
    simulator's `--break quorum-duplicate-signer` hands one that counts a signer twice."""
    key_holder: NodeKeyHolder | None = None
    """Where the node key lives (agent.key_holder): left out, node.key as a file. A TPM identity's is its TPM."""
    session_keys: SessionKeys | None = None
    """A TPM identity's session keys (agent.session_key): the dial and `node_key` run on them; None: a file key."""
    machine: MachineTree | None = None
    """A ramdisk's disks, NICs and PCI GPUs (agent.ramdisk); None on a node or site."""
    kexec: Kexec | None = None
    """A ramdisk's kexec edge (agent.ramdisk.kexec); None on a node or site."""
    instances: InstanceRuntime | None = None
    """The VM runtime the `instances` section runs on (agent.instances): the fake under --fake-hw, qemu where
    `qemu-system-x86_64` is on PATH; None: no converger, and a non-empty section is UNSUPPORTED."""
    more_instances: tuple[InstanceRuntime, ...] = ()
    """VM runtimes beside `instances` (libvirt, where its connection answers)."""
    tunnel_tls: tuple[Path, Path] | None = None
    """The node's TLS certificate and key files, which its tunnels serve TLS with (agent.tunnel.service); None:
    every tunnel is refused (a TPM key, which OpenSSL cannot be handed; the simulator)."""


async def never_dial() -> Link[session_pb2.GatewayMessage, session_pb2.NodeMessage]:
    """The dial of a test-only build (bc.runtime.version.test_never_dial): it never connects."""
    log.warning("event=agent.never-dial; this is a test-only build")
    await asyncio.Future()
    raise AssertionError("unreachable")


def production_parts(opts: AgentOptions) -> AgentParts:
    """What `bc node` runs on: the host's clock, a Random seeded from the OS once, the files in the data
    dir (read here, before the loop), gRPC, and NVML or the named fake. Secret material (the node key made
    at join and at each renewal) comes from the OS, never from this Random."""
    rng = os_seeded_random()
    clock = SystemClock()
    data_dir = opts.data_dir
    identity = Identity.load(data_dir)
    ca_pem = identity.read(data_dir, "ca")
    hw: HardwareBackend = open_backend(opts.fake_hw, identity.node_id, state_dir=data_dir, rng=rng, offload=to_thread)
    health = hw.capabilities.health(data_dir, opts.fake_faults)
    journal_path = data_dir / "journal.db"
    ramdisk = ramdisk_parts(data_dir, opts.machine_root, hw, rng) if identity.role == "ramdisk" else None
    if ramdisk is not None:
        hw, journal_path = ramdisk.hw, ramdisk.journal_path
    key_path = data_dir / identity.files["key"]
    holder: NodeKeyHolder = FileNodeKey(key_path)
    keeper: SessionKeys | None = None
    node_key = NodeKey(key_path)
    pair: PairSource | None = None
    record = _tpm_record(key_path)
    if record is not None:  # the key is the TPM's: the session runs on an in-memory session key
        holder = TpmNodeKey(open_tpm(opts.helper_socket, opts.tcti), record)
        keeper = SessionKeys(data_dir, identity, holder, clock, rng)
        node_key = NodeKey(None, source=keeper.key)
        pair = MemoryPair(keeper.pair)
    return AgentParts(
        clock=clock,
        rng=rng,
        identity=identity,
        ca_pem=ca_pem,
        identity_store=IdentityFile(data_dir, to_thread),
        node_key=node_key,
        hw=hw,
        dial=never_dial if test_never_dial() else grpc_dial(data_dir, identity, ca_pem, to_thread, rng, pair),
        open_journal=lambda: Journal.open(journal_path, identity.node_id, rng=rng, clock=clock),
        offload=to_thread,
        health=health,
        telemetry=True,
        secrets=True,
        key_holder=holder,
        session_keys=keeper,
        machine=ramdisk.machine if ramdisk is not None else None,
        kexec=ramdisk.kexec if ramdisk is not None else None,
        tunnel_tls=(data_dir / identity.files["cert"], key_path) if record is None else None,
        instances=(
            instance_runtime(
                data_dir,
                hw,
                to_thread,
                opts.instance_accel,
                opts.instance_runtime,
                opts.instance_stop_grace_s,
                opts.helper_socket,
            )
            if identity.role == "node"
            else None
        ),
        more_instances=libvirt_runtimes(data_dir, hw, opts) if identity.role == "node" else (),
    )


def instance_runtime(
    data_dir: Path,
    hw: HardwareBackend,
    offload: Offload,
    accel: tuple[str, ...],
    choice: str = "auto",
    stop_grace_s: float = 60.0,
    helper_socket: Path | None = None,
    is_root: bool | None = None,
) -> InstanceRuntime | None:
    """The node's VM runtime: `auto` is the fake on fake hardware, else qemu when it is installed, else none;
    `fake` and `qemu` ask for one (qemu must be installed). An agent that is not root starts its VMMs through
    `bc helper` (`helper_socket`), each as its own user; with no helper, as its own user."""
    if choice == "fake" or (choice == "auto" and not hw.capabilities.touches_host):
        return FakeRuntime(data_dir / "fake-instances.json", offload)
    if shutil.which(QEMU) is not None:
        steps = None
        root = os.geteuid() == 0 if is_root is None else is_root
        if not root and helper_socket is not None:
            steps = HelperVmm(HelperClient(helper_socket))
        elif not root:
            log.warning(
                "event=instance.vmm-unconfined reason=the agent is not root and has no helper: VMMs run as its own"
                " user, not each as their own (docs/instances.md)"
            )
        return QemuRuntime(
            data_dir / "instances",
            offload,
            accel=accel,
            taps=NetlinkTaps(),
            stop_grace_s=stop_grace_s,
            confine=root,
            steps=steps,
        )
    if choice == "qemu":
        raise UsageError(f"--instance-runtime qemu: {QEMU} is not installed on this host")
    return None


def instance_network(
    runtime: InstanceRuntime | None,
    data_dir: Path,
    offload: Offload,
    on_restored: Callable[[dict[str, object]], Awaitable[None]],
) -> InstanceNetwork | None:
    """The instances' network rules where VMs are real: loaded by this agent (root), or by `bc helper` from the
    network record (an agent whose qemu runtime starts its VMMs through the helper); None under --fake-hw."""
    if not isinstance(runtime, QemuRuntime):
        return None
    if isinstance(runtime.steps, HelperVmm):
        return HelperNetwork(runtime.steps.client, data_dir, offload, on_restored=on_restored)
    return InstanceNetwork(on_restored=on_restored)


def libvirt_runtimes(data_dir: Path, hw: HardwareBackend, opts: AgentOptions) -> tuple[InstanceRuntime, ...]:
    """The libvirt runtime on a real host whose libvirt-python imports and whose connection answers (never beside
    the fake runtime: `--instance-runtime fake` is a lab's)."""
    if not hw.capabilities.touches_host or opts.instance_runtime == "fake":
        return ()
    rt = open_libvirt(
        data_dir / "libvirt", to_thread, opts.libvirt_uri, opts.instance_accel, opts.instance_stop_grace_s
    )
    return (rt,) if rt is not None else ()


def instance_runtimes(parts: AgentParts) -> dict[str, InstanceRuntime]:
    """Every VM runtime of the node by name (the `instances` section's `runtime` picks one)."""
    found = ((parts.instances,) if parts.instances is not None else ()) + parts.more_instances
    return {rt.name: rt for rt in found}


def user_data_dir(data_dir: Path, hw: HardwareBackend) -> Path:
    """Where instances' user data files go: on tmpfs (the service's $RUNTIME_DIRECTORY, else /run/bc) on a real
    host; under the data directory on fake hardware (a test's or a simulation's tmp dir)."""
    if not hw.capabilities.touches_host:
        return data_dir / "run" / "user-data"
    return Path((os.environ.get("RUNTIME_DIRECTORY") or "/run/bc").split(":")[0]) / "user-data"


class Agent:
    def __init__(self, opts: AgentOptions, parts: AgentParts | None = None) -> None:
        """`parts` left out: `production_parts(opts)`, which reads the identity files now."""
        self.opts = opts
        self.parts = p = parts or production_parts(opts)
        self.clock, self.rng, self.offload = p.clock, p.rng, p.offload
        self.data_dir = opts.data_dir
        self.identity = p.identity
        self.node_id = p.identity.node_id
        self.hw = p.hw
        self.node_key = p.node_key
        self.incarnation_id = f"{p.rng.getrandbits(64):016x}"  # this process: new at every start
        self.trust = AgentTrust(p.identity.trust_bundle())
        self.outbox = Outbox()
        self.stopped = asyncio.Event()
        self.connected = asyncio.Event()  # while a session is welcomed
        self.revoked_reason = ""
        self.fatal: BcError | None = None  # a failure no retry helps that is not the server's (a cleared TPM)
        self.pending_events: list[tuple[str, int, bytes]] = []
        self.pending_reports: list[session_pb2.AllocationReport] = []  # not signed yet (a TPM that did not answer)
        self.unknown_fields = UnknownFieldsMemo()  # the converge pass's walk for unknown fields, once per spec
        self.cert_renewals = 0
        self.renewer: Renewer | None = None  # built by the renewal loop
        self.sessions: SessionLoop | None = None  # built by open(), with the journal and the dispatcher
        self.metrics = AgentMetrics()
        self.health = HealthMonitor(p.health, p.clock, p.offload) if p.health is not None else None
        self.telemetry = TelemetryLoop(self.node_id, self.metrics, self.gauges, p.offload) if p.telemetry else None
        self.converge_error = ""  # the last converge pass's exception, for NodeReady
        self.version = p.version or bc_version()
        self.upgrader: Upgrader | None = None
        self.xids: HelperXids | None = None  # an unprivileged agent's XIDs, streamed by bc helper
        self.host_units: HostConverger | None = None
        self.site: SiteState | None = None  # a site agent's BMCs, leases, cache and boot server (agent.site)

    async def open(self) -> None:
        p = self.parts
        self.journal = await p.open_journal()
        # An older agent may have journaled a result no gateway accepts: settle it before the first Hello.
        await self.journal.settle_oversized()
        self.state = NodeState(
            identity=p.identity,
            identity_store=p.identity_store,
            ca_pem=p.ca_pem,
            trust=self.trust,
            journal=self.journal,
            outbox=self.outbox,
            clock=self.clock,
            connected=self.connected,
        )
        await self.state.load()
        if p.session_keys is not None:  # what it needs of the session's state, known from here on
            p.session_keys.server_offset_ms = lambda: self.state.offset_ms
            p.session_keys.on_new = self.on_session_key
            p.session_keys.on_stale = self.on_node_cert_stale
        cdi_dir = self.opts.cdi_dir or self.data_dir / "cdi"
        env_dir = self.opts.env_dir or self.data_dir / "allocations"
        slices = p.slices
        if slices is None:
            slices = open_slices(self.hw.capabilities.touches_host, self.data_dir, offload=self.offload)
        self.secrets: SecretClient | None = None
        if p.secrets:
            self.secrets = SecretClient(
                self.node_id,
                self.outbox,
                self._sign_secret_request,
                self.state.server_now_ms,
                self.clock,
                self.rng,
                self.state.spec_changed.set,
            )
        files: HoldFiles | None = None
        host: Converger
        access: Converger = access_converger(
            self.opts.ssh_dir or self.data_dir / "ssh",
            self.node_id,
            sshd_config=self.opts.sshd_config,
            reload_cmd=self.opts.sshd_reload_cmd,
            fake_host=not self.hw.capabilities.touches_host,
            offload=self.offload,
        )
        seams: HelperSeams | None = None
        if self.opts.helper_socket is not None:
            seams = await helper_seams(
                self.opts.helper_socket,
                self.hw,
                self.data_dir,
                root=self.opts.host_root or Path("/"),
                offload=self.offload,
                node_id=self.node_id,
                node_labels=self.state.labels,
            )
            access = seams.access
            self.hw, files, slices = seams.hw, seams.files, seams.slices
            cdi_dir, env_dir = seams.layout.cdi_dir, seams.layout.env_dir
            host = seams.host if self.opts.host_units else ExternallyManaged()
            if isinstance(host, HostConverger):
                host.ctx.secrets = self.secrets
            self.xids = seams.xids
        else:
            host = await host_converger(
                self.hw,
                self.data_dir,
                cdi_dir,
                host_root=self.opts.host_root,
                host_units=self.opts.host_units,
                offload=self.offload,
                node_labels=self.state.labels,
                secrets=self.secrets,
            )
        self.host_units = host if isinstance(host, HostConverger) else None  # its units' conditions, for health
        # BINDING_INSTANCE bookings (GPUs for VMs) are taken only where VMs run (agent.instances.gpu_wiring).
        bookings = gpu_wiring.bookings(self.data_dir, self.offload) if p.instances is not None else None
        self.convergers: dict[str, Converger] = {
            "devices": p.devices_converger(
                cdi_dir,
                env_dir,
                self.hw,
                self.node_id,
                offload=self.offload,
                slices=slices,
                dev_nodes=device_nodes(self.hw),
                files=files,
                instance_bookings=bookings,
                in_vms=gpu_wiring.in_vms(self.data_dir) if bookings is not None else None,
            ),
            "host": host,
            "access": access,
        }
        if self.telemetry is not None:
            self.convergers["telemetry"] = TelemetryConverger(self.telemetry, self.secrets)
        inv = await self.offload(self.hw.inventory)
        self.outbox.note_inventory(inv, inventory_hash(inv))
        self.boot_id = await self.offload(self.hw.boot_id)
        slots: SlotStore | None = None
        # A ramdisk never updates itself (reference: a non-empty `daemon` section is UNSUPPORTED there): the
        # next ramdisk boot brings the next release.
        installed = self.opts.install_dir if self.identity.role != "ramdisk" else None
        if installed is not None:  # under the helper, root's install dir is the helper's to change
            slots = (
                Slots(installed, self.offload)
                if seams is None
                else seams.install_slots(installed, lambda: self.trust.bundle)
            )
        if slots is not None:
            self.upgrader = Upgrader(
                slots,
                running_version=self.version,
                clock=self.clock,
                boot_id=self.boot_id,
                ca_pem=p.ca_pem,
                release_keys=lambda: list(self.trust.bundle.release_keys),
                restart=self.restart,
                config=self.opts.upgrade,
                offload=self.offload,
            )
            await self.upgrader.start()
        up = self.upgrader
        self.convergers["daemon"] = DaemonConverger(up, self.version)
        self.instances: InstancesConverger | None = None
        # The instances' network rules (nftables, agent.instances.net) wherever VMs are real; under --fake-hw
        # none are loaded, and an instance with a confining network policy fails there.
        self.network = instance_network(p.instances, self.data_dir, self.offload, self._rules_restored)
        self.balloons: BalloonController | None = None
        self.snapshots, rebinder = snapshot_parts(
            p.instances,
            self.data_dir,
            self.offload,
            self.clock,
            ca_pem=p.ca_pem,
            secrets=self.secrets,
            wake=self.state.spec_changed.set,
            rng=p.rng,
        )
        runtimes = instance_runtimes(p)
        if runtimes:
            self.instances = InstancesConverger(
                runtimes,
                self.data_dir / BOOT_DIR,
                self.host_memory,
                lambda: [a.limits.memory_bytes for a in self.state.spec.devices.assignments],
                self.offload,
                secrets=self.secrets,
                user_data=UserDataFiles(user_data_dir(self.data_dir, self.hw), self.offload),
                gpus=await gpu_wiring.passthrough(
                    self.data_dir,
                    self.hw,
                    self.offload,
                    lambda: self.state.spec.devices,
                    bookings,
                    release=p.instances.steps.unvfio
                    if isinstance(p.instances, QemuRuntime) and p.instances.steps is not None
                    else None,
                )
                if bookings is not None
                else None,
                topology=self.host_topology,
                disks=instance_disks(self.data_dir, self.offload, self.clock, p.ca_pem, self.state.spec_changed.set),
                snapshots=self.snapshots,
                rebinder=rebinder,
                network=self.network,
            )
            self.convergers["instances"] = self.instances
            self.balloons = BalloonController(
                runtimes,
                self.instances.ballooned,
                self.memory_pressure,
                self.opts.balloon_floor_percent,
                reclaimed=self.instances.balloon_mib,
            )
            devices = self.convergers["devices"]
            if isinstance(devices, DevicesConverger):  # a hold is admitted only in what the VMs leave
                devices.instances_committed_mib = self.instances.committed_mib
        executors: Callable[[str], KindExecutor | None] = executor_for
        if self.identity.role == "site":
            self.site = SiteState(
                self.data_dir,
                self.clock,
                self.offload,
                self.opts.site,
                wake=self.state.spec_changed.set,
                secret_source=self.secrets,
            )
            self.convergers["site"] = SiteConverger(self.site)
            site_kinds = site_executors(self.site)
            executors = lambda kind: site_kinds.get(kind) or executor_for(kind)  # noqa: E731
        self.dispatcher = Dispatcher(
            node_id=self.node_id,
            role=self.identity.role,
            journal=self.journal,
            journal_full=self.journal.is_full,
            send=self.outbox.send,
            ctx=KindContext(
                node_id=self.node_id,
                data_dir=self.data_dir,
                hw=self.hw,
                cdi_dir=cdi_dir,
                boot_id=self.boot_id,
                allow_gpu_reset=self.opts.allow_gpu_reset,
                allow_reboot=self.opts.allow_reboot,
                log_paths=[self.data_dir / "node.log", self.data_dir / "node.log.1"],
                journal_summary=self.journal_summary,
                upload_allow=parse_prefixes(self.opts.upload_allow),
                clock=self.clock,
                offload=self.offload,
                after_gpu_reset=self.after_gpu_reset if self.health is not None else None,
                upgrader=up,
                machine=p.machine,
                kexec=p.kexec,
                gone=self.stopped.set,
                ca_pem=p.ca_pem,
                snapshots=self.snapshots,
                spec_instances=lambda: self.state.spec.instances.instances,
            ),
            clock=self.clock,
            incarnation_id=self.incarnation_id,
            boot_id=self.boot_id,
            applied_generation=lambda: self.state.applied_generation,
            server_now_ms=self.state.server_now_ms,
            signature_check=self._check_command_signature,
            quorum_check=QuorumCheck(
                self.trust,
                self.journal.claim_batch_leaf,
                UnbatchedAllowance(self.data_dir, self.clock),
                self.state.server_now_ms,
                self.clock,
                p.quorum_count,
                labels=self.state.labels,
            ),
            result_signer=self.sign_update,
            executors=executors,
            on_settled=self.metrics.command_settled,
            held=up.holds if up is not None else (lambda _cid: False),
            upgrade_only=(lambda: up.upgrade_only) if up is not None else (lambda: False),
        )
        await self.dispatcher.start()
        if up is not None:
            up.settle = self.dispatcher.settle
            await up.report_start()
        deps = SessionDeps(
            state=self.state,
            journal=self.journal,
            dispatcher=self.dispatcher,
            outbox=self.outbox,
            clock=self.clock,
            boot_id=self.boot_id,
            incarnation_id=self.incarnation_id,
            sign_update=self.sign_update,
            heartbeat_interval_s=self.opts.heartbeat_interval_s,
            spec_rule=p.spec_rule,
            secrets=self.secrets,
            # A node says each VM runtime it has (`bc.dev/cap.instances.qemu`, `…libvirt`), so a spec's VMs go where
            # they run; an older agent answers a non-empty instances section UNSUPPORTED.
            # … and that it keeps persistent volumes (the reference's `instance.volumes`: instances that attach
            # volumes go only there).
            capabilities=CAPABILITIES
            + tuple(f"instances.{name}" for name in sorted(instance_runtimes(p)))
            + (("instance.volumes",) if instance_runtimes(p) else ())
            # One that loads the instances' network rules says so (`bc.dev/cap.instance.network-policy`).
            + (("instance.network-policy",) if self.network is not None else ()),
        )
        self.tunnels = TunnelService(
            self.node_id,
            self.journal,
            jwks=lambda: self.state.spec.access.exec_ticket_jwks,
            server_now_ms=self.state.server_now_ms,
            tls_files=p.tunnel_tls,
        )
        self.state.spec_listeners.append(self.tunnels.on_spec)
        self.sessions = SessionLoop(p.dial, deps, self.rng, self.stopped, alongside=self.tunnels.serve)
        log.info(
            "event=agent.started node=%s version=%s slot=%s journal_id=%s applied=%d incarnation=%s hw=%s cdi_dir=%s",
            self.node_id,
            self.version,
            up.slot if up is not None else "none",
            self.journal.journal_id,
            self.state.applied_generation,
            self.incarnation_id,
            self.hw.describe(),
            cdi_dir,
        )

    # -- what tests and operators read ---------------------------------
    @property
    def applied_generation(self) -> int:
        return self.state.applied_generation

    @property
    def time_mark_ms(self) -> int:
        return self.state.time_mark_ms

    @property
    def inventory(self) -> common_pb2.Inventory:
        return self.outbox.inventory

    @property
    def frame_budget(self) -> int:
        """What a frame may hold; lowered only if a gateway refuses one as too large (agent.framing)."""
        return self.sessions.frame_budget if self.sessions is not None else LIMITS.max_frame_bytes

    # -- signing ---------------------------------------------------------
    def sign_update(self, update: CommandUpdate) -> CommandUpdate:
        """Every update leaves fitted to the size table, then signed: the signature covers what is sent,
        and what is sent is what the journal holds (it applies the same rule)."""
        return self.node_key.attest_update(fit_update_message(update))

    async def sign_report(self, body: bytes) -> session_pb2.AttestedReport:
        """An allocation report signed by the node key: in the TPM for a TPM identity (a report may be sent after
        this process's session key is gone), else the key file's."""
        if self.parts.session_keys is not None and self.parts.key_holder is not None:
            sig = await self.parts.key_holder.sign(attest.report_message(body))
            return session_pb2.AttestedReport(body=body, node_sig=sig)
        return self.node_key.sign_report(body)

    async def _sign_secret_request(self, message: bytes) -> bytes:
        """A SecretRequest is signed by the key the session runs on (a TPM identity's session key): the broker
        checks it against the node's live certificates, session certificates included."""
        if not self.node_key.ready():
            raise SecretUnavailable("no session key is certified yet to sign the request with")
        return self.node_key.sign(message)

    def _check_command_signature(self, cmd: session_pb2.Command, body: session_pb2.CommandBody) -> str | None:
        why = self.trust.check_command(cmd, self.state.server_now_ms() / 1000)
        if why is None:
            return None
        log.error("event=command.bad-signature command=%s kind=%s why=%s", body.id, body.kind, why)
        return f"BAD_SIGNATURE: {why}"

    async def upgrade_watch(self, upgrader: Upgrader) -> None:
        """Confirm (or roll back) a pending self-update; a confirm re-runs the converge pass at once, so the
        `daemon` section reports CONVERGED without waiting for the drift pass."""
        await upgrader.watch(self.connected)
        self.state.spec_changed.set()

    async def restart(self) -> None:
        """Start `current` again (a self-update's switch or rollback): the injected way, else the process's."""
        if self.parts.restart is not None:
            await self.parts.restart()
            return
        assert self.opts.install_dir is not None
        restart_process(self.opts.install_dir, reexec=not self.hw.capabilities.touches_host and not _under_systemd())

    async def close(self) -> None:
        await self.dispatcher.stop()
        if self.site is not None:
            await self.site.close()
        instances: InstancesConverger | None = getattr(self, "instances", None)  # set once the parts are built
        if instances is not None and instances.disks is not None:
            await instances.disks.images.close()  # image downloads under way end with the agent
        await self.journal.close()

    async def journal_summary(self) -> dict[str, object]:
        entries = await self.journal.commands()
        return {
            "node_id": self.node_id,
            "journal_id": self.journal.journal_id,
            "applied_generation": self.state.applied_generation,
            "observed_generation": self.state.observed_generation,
            "commands": {st: sum(1 for e in entries if e.state == st) for st in ("accepted", "running", "done")},
            "unacked_events": len(await self.journal.unacked_events(limit=100_000)),
        }

    # -- the converge loop ---------------------------------------------
    async def converge_once(self) -> None:
        st = self.state
        generation = st.applied_generation
        outcome = await run(st.spec, generation, self.convergers, self.unknown_fields)
        self.metrics.converge_pass(outcome.durations)
        self.pending_reports.extend(outcome.events)
        while self.pending_reports:
            r = self.pending_reports[0]
            kind = session_pb2.AllocationReport.Kind.Name(r.kind).lower()
            # A TPM that does not answer raises here: the report waits, unsigned, for the next pass.
            report = await self.sign_report(r.SerializeToString(deterministic=True))
            self.pending_reports.pop(0)
            self.pending_events.append(
                (
                    f"allocation.{kind}",
                    session_pb2.RESULT,
                    session_pb2.NodeEvent(type=f"allocation.{kind}", report=report).SerializeToString(),
                )
            )
            log.info(
                "event=allocation.%s allocation=%s reason=%s generation=%d",
                kind,
                r.allocation_id,
                r.reason,
                r.generation,
            )
        if self.pending_events:
            try:
                await self.journal.append_events(self.pending_events)
                self.pending_events = []
            except JournalFull:
                # Results are never dropped: keep them in memory and try again on the next pass; until acks
                # drain the journal, new commands are answered BUSY and this spec is not reported observed.
                log.error("event=journal.full pending_events=%d", len(self.pending_events))
                outcome = dataclasses.replace(outcome, observed=False)
        if outcome.observed and generation > st.observed_generation:
            await st.observed(generation)
        inv = await self.offload(self.hw.inventory)
        if self.health is not None:
            self.health.overlay(inv)  # GpuHealthy=False reads `healthy: false`: NoSchedule for new holds
        inv_hash = inventory_hash(inv)
        status = session_pb2.StatusReport(
            applied_generation=generation,
            observed_generation=st.observed_generation,
            applied_spec_hash=st.applied_spec_hash,
            sections=outcome.statuses,
            inventory_hash=inv_hash,
            conditions=self.health.conditions() if self.health is not None else [],
        )
        if self.instances is not None:
            status.instances.extend(self.instances.statuses)
            status.instances_complete = self.instances.complete
            if self.instances.disks is not None and self.instances.disks.storage is not None:
                status.volume_storage.CopyFrom(self.instances.disks.storage)
        self.outbox.put_status(status, inv, inv_hash)

    async def host_memory(self) -> HostMemory | None:
        """What instance admission counts on: /proc/meminfo on a real host, the inventory on fake hardware;
        None (start without the check, with a warning) when it cannot be read."""
        if self.hw.capabilities.touches_host:
            try:
                return parse_meminfo(await self.offload(Path("/proc/meminfo").read_text))
            except (OSError, ValueError) as e:
                log.warning("event=instance.meminfo-unreadable error=%r", str(e))
                return None
        inv = await self.offload(self.hw.inventory)
        if inv.memory_bytes <= 0:
            return None
        pool = sum(n.hugepages_1g for n in inv.numa_nodes) * 1024
        return HostMemory(inv.memory_bytes // (1 << 20), pool)

    async def memory_pressure(self) -> HostPressure | None:
        """The balloon controller's view of the host: /proc/meminfo and PSI on a real host; None on fake
        hardware (its guests allocate nothing, so there is no pressure to read)."""
        if not self.hw.capabilities.touches_host:
            return None
        try:
            meminfo = await self.offload(Path("/proc/meminfo").read_text)
        except OSError as e:
            log.warning("event=instance.meminfo-unreadable error=%r", str(e))
            return None
        try:
            psi = await self.offload(Path("/proc/pressure/memory").read_text)
        except OSError:
            psi = ""  # a kernel without PSI: pressure is judged on what is available alone
        try:
            return parse_pressure(meminfo, psi)
        except ValueError as e:
            log.warning("event=instance.meminfo-unreadable error=%r", str(e))
            return None

    async def host_topology(self) -> HostTopology | None:
        """Where instances may be placed: sysfs on a real host, the inventory's NUMA nodes on fake hardware
        (its 1 GiB pages all free); None when it cannot be read."""
        if self.hw.capabilities.touches_host:
            try:
                return await self.offload(read_topology)
            except (OSError, ValueError) as e:
                log.warning("event=instance.topology-unreadable error=%r", str(e))
                return None
        inv = await self.offload(self.hw.inventory)
        return fake_topology(inv)

    async def converge_loop(self) -> None:
        while not self.stopped.is_set():
            self.state.spec_changed.clear()
            try:
                await self.converge_once()
                await self.dispatcher.maybe_sweep()
                self.converge_error = ""
            except Exception as e:  # a converge pass must never kill the agent; the next pass retries
                log.exception("event=converge.failed")
                self.converge_error = f"{type(e).__name__}: {e}"
            await wait_event(self.state.spec_changed, self.opts.drift_pass_s)

    # -- health and telemetry ------------------------------------------
    async def _rules_restored(self, body: dict[str, object]) -> None:
        """The guard put flushed instance rules back: journal the node event `instance.rules-restored`."""
        ev = session_pb2.NodeEvent(type=RESTORED_EVENT, body=json.dumps(body, sort_keys=True).encode())
        try:
            await self.journal.append_events([(RESTORED_EVENT, session_pb2.TRANSITION, ev.SerializeToString())])
        except JournalFull:
            log.error("event=journal.full dropped=%s", RESTORED_EVENT)
        self.outbox.poke()

    async def health_loop(self) -> None:
        """Read health every HEALTH_PASS_S; a changed condition wakes the converge loop, which reports it."""
        if self.health is None:
            return
        while not self.stopped.is_set():
            try:
                changes = await self.health.poll(
                    journal_full=await self.journal.is_full(),
                    offset_ms=self.state.offset_ms,
                    converge_error=self.converge_error,
                    host=self.host_units.verdicts if self.host_units is not None else (),
                )
                if changes:
                    self.state.spec_changed.set()  # not a new spec: a pass that reports the new conditions
            except Exception:  # health must never kill the agent either
                log.exception("event=health.failed")
            await wait_event(self.stopped, HEALTH_PASS_S)

    async def after_gpu_reset(self, uuids: Sequence[str]) -> dict[str, bool]:
        assert self.health is not None
        verdicts = await self.health.after_reset(uuids)
        self.state.spec_changed.set()
        return verdicts

    async def gauges(self) -> Gauges:
        last = self.health.last if self.health is not None else None
        stats = await self.journal.event_stats()
        return Gauges(
            journal_bytes=stats[1],
            unacked_events=stats[0],
            session_connected=self.connected.is_set(),
            sessions_started=self.sessions.sessions_started if self.sessions is not None else 0,
            gpus=last.gpus if last is not None else (),
        )

    async def telemetry_loop(self) -> None:
        if self.telemetry is not None:
            await self.telemetry.run(self.stopped)

    # -- the session loop ----------------------------------------------
    async def session_loop(self) -> None:
        assert self.sessions is not None, "open() builds the session loop"
        refusal = await self.sessions.run()
        if refusal is None:
            return
        log.error("event=agent.revoked reason=%s; not redialing with this certificate", refusal.reason)
        self.revoked_reason = refusal.reason
        await self.state.certificate_refused(refusal.reason)
        self.stopped.set()

    # -- certificate renewal -------------------------------------------
    async def renewal_loop(self) -> None:
        if not self.parts.renewal:
            return
        self.renewer = Renewer(
            self.data_dir,
            self.identity,
            self.clock,
            self.rng,
            on_renewed=self.on_cert_renewed,
            on_trust=self.trust.set,
            server_offset_ms=lambda: self.state.offset_ms,
            key_holder=self.parts.key_holder,
            by_proof=self.parts.session_keys is not None,
            identity_lock=self.parts.session_keys.identity_lock if self.parts.session_keys is not None else None,
        )
        await self.renewer.run()

    def on_cert_renewed(self) -> None:
        """Move the session to the new certificate: end it, and the redial reads the new pair.

        The gateway closes a session whose certificate expires, so waiting for the session to end by
        itself is not enough; the session ends as if the gateway closed it cleanly (welcomed, so the
        redial comes at once, under a second of jitter). A TPM identity's session runs on a session
        certificate of the old node certificate: a new one is asked for now, and its arrival rotates the
        session (`on_session_key`).
        """
        self.cert_renewals += 1
        if self.parts.session_keys is not None:
            self.parts.session_keys.wake()
        elif self.sessions is not None:
            self.sessions.rotate("certificate-renewed")

    def on_session_key(self) -> None:
        """A new session certificate: the session moves onto it (a first one cuts the dial's back-off short)."""
        if self.sessions is not None:
            self.sessions.rotate("session-certificate")

    def on_node_cert_stale(self) -> None:
        """The server will not certify a session key with the node certificate held (not the latest, expired):
        the renewer renews or re-joins it now rather than at its time."""
        if self.renewer is not None:
            self.renewer.renew_soon()

    async def session_key_loop(self) -> None:
        """A TPM identity's session keys (agent.session_key) until refused for good: then the agent stops, as
        it does when a gateway refuses a revoked certificate."""
        keeper = self.parts.session_keys
        if keeper is None or not self.parts.renewal:
            return
        end = await keeper.run()
        if end.by_server:
            log.error("event=agent.revoked reason=%s; not asking for a session certificate again", end.error.message)
            self.revoked_reason = end.error.message
            await self.state.certificate_refused(end.error.message)
        else:
            log.error("event=agent.stopped reason=%s", end.error.message)
            self.fatal = end.error
        self.stopped.set()

    async def run(self) -> None:
        if self.identity.revoked:
            raise Unauthenticated(
                f"this node's certificate was revoked ({self.identity.revoked}); it will not dial with it again."
                " Join again: bc join --reset --yes, then bc join"
            )
        await self.open()
        if self.upgrader is not None and self.upgrader.must_restart:
            await self.close()
            await self.restart()
            return
        tasks = [
            asyncio.create_task(self.session_loop(), name="session"),
            asyncio.create_task(self.converge_loop(), name="converge"),
            asyncio.create_task(self.renewal_loop(), name="renewal"),
            asyncio.create_task(self.session_key_loop(), name="session-key"),
            asyncio.create_task(self.health_loop(), name="health"),
            asyncio.create_task(self.telemetry_loop(), name="telemetry"),
        ]
        if self.upgrader is not None:
            tasks.append(asyncio.create_task(self.upgrade_watch(self.upgrader), name="upgrade-watch"))
        if self.xids is not None:
            tasks.append(asyncio.create_task(self.xids.run(self.stopped), name="xids"))
        if self.balloons is not None:
            tasks.append(asyncio.create_task(self.balloons.run(self.stopped), name="balloons"))
        if self.network is not None:  # the 5-s guard that puts flushed instance rules back
            tasks.append(asyncio.create_task(self.network.run(self.stopped), name="instance-rules"))
        try:
            await self.stopped.wait()
        finally:
            await cancel_and_wait(tasks)
            await self.close()
        if self.fatal is not None:
            raise self.fatal


def _tpm_record(path: Path) -> TpmRecord | None:
    """node.key's record of a key the TPM holds (`bc join --attestor tpm`), or None for a key file."""
    try:
        data = path.read_bytes()
    except OSError:
        return None  # a missing key is the session's to report, as before
    return TpmRecord.load(data) if TpmRecord.is_record(data) else None


def _under_systemd() -> bool:
    import os

    return bool(os.environ.get("INVOCATION_ID"))


async def run_agent(opts: AgentOptions) -> None:
    from bc.runtime import logs

    logs.setup("node", file=opts.data_dir / "node.log")
    agent = Agent(opts)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, agent.stopped.set)
    try:
        await agent.run()
    except UpgradeRefused as e:
        raise Conflict(str(e)) from None
    if agent.revoked_reason:
        raise Unauthenticated(f"this node's certificate was refused: {agent.revoked_reason}")
