"""Seeded fake GPUs, so a laptop or the simulator can run `bc node` as a GPU host.

A profile (`profiles/<name>.json`) says what GPUs a machine has; the seed
(normally the node id) makes their UUIDs. UUIDs come from a hash of seed,
profile and index, so a node sees the same GPUs on every start (its holds in
/etc/cdi still resolve after a restart) and two nodes never share a UUID.
Host facts (hostname, CPUs, memory) come from the profile and seed too, so
the inventory and its hash depend on nothing but (profile, seed), which the
simulator needs to replay a run.

Only GPUs are faked, unless the fake is given a state dir: then it keeps a
fake boot id there too, so `node.reboot` can "reboot" a fake node (a new
boot id and a restart of the process) without touching the host, and GPU
resets and reboots are counted in files tests can read. Diagnostics are seeded like
the UUIDs: the same counters for the same (node, GPU) on every call.

A new boot id (the first start on a state dir, and every fake reboot) is
drawn from the agent's `random.Random` (`rng`), so the simulator replays it;
the state files are written through the agent's `offload` (agent.offload).
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import logging
import os
import random
import sys
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from agent.health.readings import HealthSource
from agent.hw.base import UNKNOWN_GPU, Capabilities, diag_entry, read_boot_id
from agent.hw.fake_faults import FAULTS_FILE, FakeHealthSource, parse_faults
from agent.hw.fake_gpu_host import TOOLS as GPU_HOST_TOOLS
from agent.hw.fake_gpu_host import FakeGpuHost
from agent.hw.fake_mig import FakeMig
from agent.hw.slices import FAKE_SLICES_DIR, FakeSlices
from agent.offload import Offload, to_thread
from bc.pki.secrets_source import os_seeded_random
from bc.protocol.pb import common_pb2
from bc.runtime.files import atomic_write

log = logging.getLogger(__name__)

_PROFILES = "profiles"
BOOT_ID_FILE = "fake-boot-id"
RESETS_FILE = "fake-gpu-resets.json"
REBOOTS_FILE = "fake-reboots.json"


def _uuid(prefix: str, *parts: object) -> str:
    """`<prefix>-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` from a hash of the parts."""
    h = hashlib.sha256("\0".join(str(p) for p in parts).encode()).hexdigest()
    return f"{prefix}-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _load_profile(name: str) -> dict[str, Any]:
    known = FakeHardware.profiles()
    if name not in known:
        raise ValueError(f"unknown fake hardware profile {name!r}; profiles are {', '.join(known)}")
    text = resources.files(__package__ or "agent.hw").joinpath(_PROFILES, f"{name}.json").read_text("utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def _write_text(path: Path, text: str) -> None:
    """Whole file or nothing: a crash mid-write must not leave a torn boot id."""
    atomic_write(path, text.encode())


@dataclass(frozen=True)
class InProcessReboot:
    """A fake reboot that never re-executes the process (the simulator's, `bc.sim.pair`): `reboot()` waits
    `takes_s` on the loop's clock, boots anew (new boot id, fake slices gone), then calls `hook`."""

    hook: Callable[[], object]
    takes_s: float = 0.0
    hang: bool = False
    """After the hook, never return: the machine went down under the command (the caller's restart ends it)."""


def boot_anew(state_dir: Path, boot_id: str) -> None:
    """What a fake machine's reboot leaves on its disk: the new boot id, and no fake slice (runtime
    properties do not survive a reboot, agent.hw.slices)."""
    FakeSlices.drop_all(state_dir / FAKE_SLICES_DIR)
    _write_text(state_dir / BOOT_ID_FILE, boot_id + "\n")


class FakeHardware:
    """A HardwareBackend whose GPUs come from a profile and a seed (built by `agent.hw.open_backend`)."""

    reboot_hook: Callable[[], object] | None = None
    """Called by `reboot()` instead of re-executing the process (set it in in-process tests)."""
    in_process_reboot: InProcessReboot | None = None

    def __init__(
        self,
        profile: str,
        seed: str,
        *,
        state_dir: Path | None = None,
        rng: random.Random | None = None,
        offload: Offload = to_thread,
        reboot: InProcessReboot | None = None,
    ) -> None:
        """`rng`: the agent's Random, which new boot ids come from (left out, the production one: OS-seeded).
        `reboot`: reboots happen in this process (left out: a reboot re-executes it)."""
        self.profile = profile
        self.seed = seed
        self.rng = rng or os_seeded_random()
        self.offload = offload
        # How long a fake GPU reset takes (BC_FAKE_GPU_RESET_S): long enough, a test can kill the agent mid-reset.
        self.reset_seconds = float(os.environ.get("BC_FAKE_GPU_RESET_S", "0") or 0)
        # How long an explicit inventory refresh takes (BC_FAKE_INVENTORY_REFRESH_S), for the same reason.
        self.refresh_seconds = float(os.environ.get("BC_FAKE_INVENTORY_REFRESH_S", "0") or 0)
        self.state_dir = state_dir
        if reboot is not None:
            self.in_process_reboot = reboot
            self.reboot_hook = reboot.hook
        self._data = _load_profile(profile)
        self._inventory = self._build(self._data)
        self._overlaid: tuple[tuple[int, str], common_pb2.Inventory] | None = None
        self.mig = FakeMig(seed, profile, self._data, state_dir)  # the MIG layout nvidia-smi changes (fake_mig)
        # The driver, packages and services the GPU node host units change (fake_gpu_host).
        self.gpu_host = FakeGpuHost(str(self._data.get("driver_version", "")), state_dir)
        # A model: its node never touches the host; `nvidia-smi` is answered by the MIG model, the package
        # managers, `modprobe`, `systemctl` and `kubeadm` by the GPU host model.
        self.capabilities = Capabilities(
            touches_host=False,
            health=self._health_source,
            tools={"nvidia-smi": self.mig.handle, **dict.fromkeys(GPU_HOST_TOOLS, self.gpu_host.handle)},
            nvswitches=tuple(str(s["pci_bus_id"]) for s in self._data.get("nvswitches", [])),
        )

    def _health_source(self, data_dir: Path, faults: Sequence[str]) -> HealthSource:
        """The seeded counters with the `--fake-fault` faults on top, and those written to the faults file."""
        return FakeHealthSource(self, parse_faults(faults), data_dir / FAULTS_FILE)

    @staticmethod
    def profiles() -> list[str]:
        """The names of the bundled profiles, sorted."""
        folder = resources.files(__package__ or "agent.hw").joinpath(_PROFILES)
        return sorted(p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json"))

    def _build(self, data: dict[str, Any]) -> common_pb2.Inventory:
        inv = common_pb2.Inventory(
            hostname=self.seed,
            source=f"fake:{self.profile}",
            driver_version=str(data.get("driver_version", "")),
            cpus=int(data.get("cpus", 0)),
            memory_bytes=int(data.get("memory_gib", 0)) * (1 << 30),
        )
        for node_id, n in enumerate(data.get("numa", [])):
            inv.numa_nodes.add(
                id=node_id,
                cpus=str(n["cpus"]),
                memory_bytes=int(n["memory_gib"]) * (1 << 30),
                hugepages_1g=int(n.get("hugepages_1g", 0)),
            )
        for index, g in enumerate(data["gpus"]):
            gpu_uuid = _uuid("GPU", self.seed, self.profile, index)
            gpu = inv.gpus.add(
                index=index,
                uuid=gpu_uuid,
                name=str(g["name"]),
                pci_bus_id=str(g.get("pci_bus_id", f"00000000:{0x18 + 0x10 * index:02X}:00.0")),
                memory_mib=int(g["memory_mib"]),
                mig_enabled=bool(g.get("mig_enabled", False)),
                slots=int(g.get("slots", 0)),
                healthy=bool(g.get("healthy", True)),
            )
            if "numa_node" in g:
                gpu.numa_node = int(g["numa_node"])
            for m in g.get("mig_instances", []):
                gi, ci = int(m["gi"]), int(m["ci"])
                gpu.mig_instances.add(
                    gi=gi,
                    ci=ci,
                    profile=str(m["profile"]),
                    uuid=_uuid("MIG", self.seed, self.profile, index, gi, ci),
                )
        return inv

    def inventory(self) -> common_pb2.Inventory:
        """A copy of the fake inventory (callers may change theirs freely).

        The MIG overlay is made once per layout change (`FakeMig.changes`), not on every read: the converge
        pass reads the inventory twice every 10 s on every simulated node."""
        changes = (self.mig.changes, self.gpu_host.loaded)
        if self._overlaid is None or self._overlaid[0] != changes:
            overlaid = common_pb2.Inventory()
            overlaid.CopyFrom(self._inventory)
            self.mig.overlay(overlaid)
            overlaid.driver_version = self.gpu_host.loaded  # the loaded driver: a reload or reboot changes it
            self._overlaid = (changes, overlaid)
        inv = common_pb2.Inventory()
        inv.CopyFrom(self._overlaid[1])
        return inv

    def boot_id(self) -> str:
        """The fake boot id kept in the state dir (made on first use), else the real kernel's."""
        if self.state_dir is None:
            return read_boot_id()
        path = self.state_dir / BOOT_ID_FILE
        try:
            current = path.read_text("utf-8").strip()
        except FileNotFoundError:
            current = ""
        if not current:
            current = self._new_boot_id()
            _write_text(path, current + "\n")
        return current

    def _new_boot_id(self) -> str:
        """Shaped like the kernel's (a random UUID), drawn from the injected Random."""
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def describe(self) -> str:
        return f"fake:{self.profile} ({len(self._inventory.gpus)} GPUs, seed {self.seed})"

    def diag(self, uuids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Seeded counters per GPU: stable per (node, GPU), unhealthy only where the profile says so."""
        gpus = {g.uuid: g for g in self._inventory.gpus}
        out: dict[str, dict[str, Any]] = {}
        for gpu_uuid in uuids or list(gpus):
            gpu = gpus.get(gpu_uuid)
            if gpu is None:
                out[gpu_uuid] = {"error": UNKNOWN_GPU}
                continue
            spec = self._data["gpus"][gpu.index]
            out[gpu_uuid] = self._diag_one(gpu.index, gpu.name, gpu.healthy, spec)
        return out

    def _diag_one(self, index: int, name: str, healthy: bool, spec: dict[str, Any]) -> dict[str, Any]:
        rng = random.Random(hashlib.sha256(f"diag\0{self.seed}\0{self.profile}\0{index}".encode()).digest())
        volatile_corrected = rng.choice((0, 0, 0, 1, 2))
        bad = not healthy
        return diag_entry(
            index=index,
            name=name,
            ecc={
                "volatile": {"corrected": volatile_corrected, "uncorrected": 2 if bad else 0},
                "aggregate": {
                    "corrected": volatile_corrected + rng.randint(0, 40),
                    "uncorrected": 2 if bad else 0,
                },
            },
            retired_pages={"single_bit": rng.randint(0, 2), "double_bit": 1 if bad else 0, "pending": False},
            row_remapping={
                "corrected": rng.randint(0, 3),
                "uncorrected": 1 if bad else 0,
                "pending": bad,
                "failure": False,
            },
            xids=[{"xid": 94, "message": "Contained ECC error"}] if bad else [],
            clocks_mhz={"graphics": rng.randint(1410, 1980), "sm": rng.randint(1410, 1980), "memory": 2619},
            temperature_c=rng.randint(28, 45),
            power_w=round(rng.uniform(60.0, 120.0), 1),
            power_limit_w=float(spec.get("power_limit_w", 700.0)),
        )

    async def reset_gpu(self, uuid: str, *, allow: bool = False) -> tuple[bool, str]:
        """Always allowed (nothing real is touched); counted in `<state_dir>/fake-gpu-resets.json`."""
        if uuid not in {g.uuid for g in self._inventory.gpus}:
            return False, UNKNOWN_GPU
        if self.state_dir is not None:
            # Counted when the reset starts: the tests count side effects started, not finished.
            await self.offload(self._count_reset, self.state_dir / RESETS_FILE, uuid)
        log.info("event=fake.gpu_reset uuid=%s seconds=%.1f", uuid, self.reset_seconds)
        if self.reset_seconds > 0:
            await asyncio.sleep(self.reset_seconds)  # a real reset takes seconds; so does this one, if asked
        return True, "reset (fake)"

    @staticmethod
    def _count_reset(path: Path, gpu_uuid: str) -> None:
        counts = FakeHardware.read_resets(path.parent)
        counts[gpu_uuid] = counts.get(gpu_uuid, 0) + 1
        _write_text(path, json.dumps(counts, indent=2, sort_keys=True) + "\n")

    @staticmethod
    def read_resets(state_dir: Path) -> dict[str, int]:
        """How many times each GPU was reset on the fake node whose state dir this is."""
        try:
            data = json.loads((state_dir / RESETS_FILE).read_text("utf-8"))
        except FileNotFoundError:
            return {}
        return {str(k): int(v) for k, v in data.items()}

    @staticmethod
    def _count_reboot(path: Path) -> None:
        count = FakeHardware.read_reboots(path.parent) + 1
        _write_text(path, json.dumps({"reboots": count}) + "\n")

    @staticmethod
    def read_reboots(state_dir: Path) -> int:
        """How many fake reboots the fake node whose state dir this is has started."""
        try:
            data = json.loads((state_dir / REBOOTS_FILE).read_text("utf-8"))
        except FileNotFoundError:
            return 0
        return int(data.get("reboots", 0))

    async def reboot(self, *, allow: bool = False) -> tuple[bool, str]:
        """A new fake boot id, then a restart of this process (or `reboot_hook`, when one is set).

        Re-executing the process is what a reboot looks like to the control
        plane: the session drops and the node rejoins with a new boot id.
        Without a state dir there is no fake boot id to change, so there is
        no fake reboot either.
        """
        in_process = self.in_process_reboot
        if in_process is not None:
            await asyncio.sleep(in_process.takes_s)  # the machine takes this long to go down
        if self.state_dir is None:
            return False, "a fake reboot needs the fake hardware's state dir"
        # Counted when the reboot starts, like a reset: the tests count side effects started, not finished.
        await self.offload(self._count_reboot, self.state_dir / REBOOTS_FILE)
        new_id = self._new_boot_id()
        await self.offload(boot_anew, self.state_dir, new_id)
        await self.offload(self.gpu_host.boot)  # the installed driver loads, enabled services start
        hook = inspect.getattr_static(self, "reboot_hook", None)  # static: a plain function must not bind to self
        if hook is not None:
            if isinstance(hook, staticmethod):
                hook = hook.__func__
            hook()
            if in_process is not None and in_process.hang:
                await asyncio.get_running_loop().create_future()  # cancelled with the process
            return True, f"rebooted (fake hook); boot id {new_id}"
        log.warning("event=fake.reboot boot_id=%s action=re-exec", new_id)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        # orig_argv, not argv: it keeps `-m <module>` and interpreter flags, so the restart is the same program.
        os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
