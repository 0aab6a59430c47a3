"""The node's snapshot parts for its instance runtime: which adapter takes snapshots and rebinds for it."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

from agent.converge.instance_rebind import Rebinder
from agent.converge.secret_port import SecretSource
from agent.instances.fake import FakeRuntime
from agent.instances.fake_snapshot import FakeSnapshots
from agent.instances.qemu import QemuRuntime
from agent.instances.qemu_snapshot import QemuSnapshots
from agent.instances.runtime import InstanceRuntime
from agent.instances.snapshots import SnapshotRuntime, Snapshots
from agent.offload import Offload
from bc.seams.clock import Clock

SNAPSHOTS_DIR = "snapshots"
REBOUND_FILE = "instances-rebound.json"


def snapshot_runtime(runtime: InstanceRuntime | None, data_dir: Path, offload: Offload) -> SnapshotRuntime | None:
    if isinstance(runtime, QemuRuntime):
        return QemuSnapshots(runtime)
    if isinstance(runtime, FakeRuntime):
        return FakeSnapshots(runtime, data_dir / "fake-instances", offload)
    return None


def snapshot_parts(
    runtime: InstanceRuntime | None,
    data_dir: Path,
    offload: Offload,
    clock: Clock,
    *,
    ca_pem: bytes,
    secrets: SecretSource | None,
    wake: Callable[[], None],
    rng: random.Random,
) -> tuple[Snapshots | None, Rebinder | None]:
    """Snapshots under `<data-dir>/snapshots/` and the rebinder recording in `instances-rebound.json`."""
    adapter = snapshot_runtime(runtime, data_dir, offload)
    if adapter is None:
        return None, None
    snapshots = Snapshots(data_dir / SNAPSHOTS_DIR, adapter, offload, clock, rng=rng, ca_pem=ca_pem, wake=wake)
    rebinder = Rebinder(data_dir / REBOUND_FILE, adapter, secrets, offload, clock, rng=rng, wake=wake)
    return snapshots, rebinder
