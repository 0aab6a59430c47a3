"""`bc sim --instances`: VMs with passed-through GPUs, through the production converger, and what V1 reads.

With `--instances` each agent gets the fake VM runtime (`agent.instances.fake.FakeRuntime`, as `bc node
--fake-hw` does) and its VFIO edge is the fake sysfs tree in its machine's directory, so the `instances`
converger, the devices converger's BINDING_INSTANCE bookings and the passthrough records are production's.
Off, agents have no instance runtime and every seed keeps its digest.

The work (`InstanceWork`, its own Random `bc-sim-instances:<seed>`, so the main workload's draws are the
ones without it):

* instance reservations (`reservations.reserve(binding="instance")`): 1-2 whole GPUs, 30 % on a named
  node, a duration of 5-30 minutes, 4 per node-hour (`instances.reservations`);
* every `SYNC_S` the instances sections follow the store, as an operator's tool would: each node's
  section names one VM per live (`placed` or `active`) instance reservation booked there, with its GPUs
  and allocation, and no other (`spec.instances` counts the sections written). A reservation that ends
  drops its VM at the next sync, so for a while its GPUs stay passed through to a VM whose booking is gone:
  the node's own defence (a new hold never binds a GPU a VM has) must hold then;
* every `SYNC_S`, and once at the end, each node's GPU use is sampled from its machine's files: the GPUs its
  CDI holds name (`agent.hw.cdi.read_holds`) and those passed through to a VM (the passthrough records),
  what V1 (`bc.sim.checkers.check_v1`) reads.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from agent.hw.cdi import read_holds
from agent.instances.passthrough import RECORDS_DIR, passed_through
from bc.control.capacity import reservations
from bc.control.nodes import specs
from bc.errors import BcError, Conflict, NotFound, Unavailable, UsageError
from bc.sim.facts import GpuUse
from bc.sim.workload import ControlPlaneLike, FleetLike
from bc.store import reservations as res_sql
from bc.store.base import StoreError

log = logging.getLogger(__name__)

SYNC_S = 20.0
RESERVATIONS_PER_NODE_HOUR = 4.0
KERNEL = "vmlinuz"
BOOT_DIR = "instance-boot"
LIVE = ("placed", "active")

NowMs = Callable[[], int]


def prepare_machine(node_dir: Path) -> None:
    """The boot file the simulated VMs name, where `bc node` looks for it (blocking)."""
    boot = node_dir / BOOT_DIR
    boot.mkdir(parents=True, exist_ok=True)
    (boot / KERNEL).write_bytes(b"a simulated kernel")


def sample(node_id: str, node_dir: Path, at_ms: int) -> GpuUse:
    """What the node's files say now (blocking: the simulator's files are on its scratch disk)."""
    held = frozenset(a.gpu_uuid for h in read_holds(node_dir / "cdi").values() for a in h.atoms)
    passed = tuple(sorted(passed_through(node_dir / RECORDS_DIR).items()))
    return GpuUse(at_ms, node_id, held, passed)


def section_for(rows: Sequence[tuple[str, str, tuple[str, ...]]]) -> str:
    """A node's instances section: one VM per (reservation, allocation, GPUs), in reservation order."""
    vms = [
        {
            "id": "vm-" + rid.removeprefix("res-")[-20:],
            "runtime": "qemu",
            "vcpus": 2,
            "memoryMib": 2048,
            "kernel": KERNEL,
            "allocationId": alloc,
            "gpus": list(gpus),
        }
        for rid, alloc, gpus in sorted(rows)
    ]
    return json.dumps({"instances": vms}, sort_keys=True)


class InstanceWork:
    """The instance work of one run; `samples` is what V1 checks."""

    def __init__(self, fleet: FleetLike, seed: int, node_dirs: dict[str, Path], now_ms: NowMs) -> None:
        self.fleet = fleet
        self.rng = random.Random(f"bc-sim-instances:{seed}")
        self.nodes = sorted(node_dirs)
        self.node_dirs = node_dirs
        self.now_ms = now_ms
        self.samples: list[GpuUse] = []
        self._written: dict[str, str] = {}

    def sample_all(self) -> None:
        at = self.now_ms()
        for n in self.nodes:
            use = sample(n, self.node_dirs[n], at)
            self.samples.append(use)
            if use.passed:  # V1's situation: a node with GPUs in VMs (the coverage of the check)
                self.fleet.work["instances.samples-with-gpus-passed"] += 1

    async def run(self) -> None:
        rate = RESERVATIONS_PER_NODE_HOUR * len(self.nodes) / 3600
        next_sync = SYNC_S
        elapsed = 0.0
        while True:
            wait = self.rng.expovariate(rate)
            if elapsed + wait >= next_sync:
                await asyncio.sleep(next_sync - elapsed)
                elapsed, next_sync = next_sync, next_sync + SYNC_S
                self.sample_all()
                await self._guarded("sync", self._sync)
                continue
            await asyncio.sleep(wait)
            elapsed += wait
            await self._guarded("reserve", self._reserve)

    async def _guarded(self, what: str, fn: Callable[[ControlPlaneLike], Awaitable[None]]) -> None:
        try:
            async with self.fleet.control() as cp:
                await fn(cp)
        except (Conflict, NotFound, UsageError) as e:
            self.fleet.work[f"refused.instances.{what}"] += 1
            log.debug("event=sim.instances-refused action=%s why=%s", what, e)
        except (Unavailable, StoreError, ConnectionError) as e:
            self.fleet.work[f"interrupted.instances.{what}"] += 1
            log.debug("event=sim.instances-interrupted action=%s why=%s", what, e)
        except BcError as e:
            self.fleet.work[f"refused.instances.{what}"] += 1
            log.debug("event=sim.instances-refused action=%s why=%s", what, e)

    async def _reserve(self, cp: ControlPlaneLike) -> None:
        gpus = self.rng.randint(1, 2)
        named = self.rng.random() < 0.3
        node = self.rng.choice(self.nodes)
        duration_ms = self.rng.randint(5, 30) * 60_000
        req = reservations.ReserveRequest(
            gpus=gpus, node_id=node if named else "", binding="instance", duration_ms=duration_ms
        )
        await reservations.reserve(cp.store, cp.bus, cp.signer, req, self.rng)
        self.fleet.work["instances.reservations"] += 1

    async def _sync(self, cp: ControlPlaneLike) -> None:
        rows = await _live_instance_bookings(cp)
        for n in self.nodes:
            text = section_for(rows.get(n, []))
            if self._written.get(n) == text:
                continue
            await specs.set_section(cp.store, cp.bus, cp.signer, n, "instances", text)
            self._written[n] = text
            self.fleet.work["spec.instances"] += 1


async def _live_instance_bookings(cp: ControlPlaneLike) -> dict[str, list[tuple[str, str, tuple[str, ...]]]]:
    """Per node: (reservation, allocation, GPUs) of each live (placed or active) instance reservation there."""
    out: dict[str, list[tuple[str, str, tuple[str, ...]]]] = {}
    async with cp.store.transaction() as tx:
        for r in await res_sql.list_(tx, state="active"):
            if str(r["binding"]) != "instance" or str(r["state"]) not in LIVE or not r["node_id"]:
                continue
            gpus = tuple(str(b["gpu_uuid"]) for b in await res_sql.bookings(tx, str(r["id"])))
            out.setdefault(str(r["node_id"]), []).append((str(r["id"]), str(r["allocation_id"]), gpus))
    return out
