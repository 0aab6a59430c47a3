"""What `bc node` builds differently for a `ramdisk` identity (agent.app.production_parts calls this).

Read before the loop, like the rest of production_parts: the boot id names the journal.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass
from pathlib import Path

from agent.hw.base import HardwareBackend
from agent.offload import to_thread
from agent.ramdisk.hardware import MachineHardware
from agent.ramdisk.journal_path import boot_journal
from agent.ramdisk.kexec import FakeKexec, Kexec, SystemKexec
from agent.ramdisk.machine import MachineTree


@dataclass(frozen=True)
class RamdiskParts:
    hw: HardwareBackend
    journal_path: Path
    machine: MachineTree
    kexec: Kexec


def ramdisk_parts(data_dir: Path, machine_root: Path | None, hw: HardwareBackend, rng: random.Random) -> RamdiskParts:
    """The machine tree, the inventory with its disks, a journal of this boot, and the kexec edge.

    On real hardware the tree is `--machine-root` (default `/`) and the kexec is real. Under `--fake-hw` a
    model never touches the host it runs on unless told to: the tree defaults to `<data dir>/machine` (no
    disks until a test puts some there; `--machine-root /` hands it the host's loop devices), and the kexec
    is the fake one."""
    fake = not hw.capabilities.touches_host
    tree = MachineTree(machine_root or (data_dir / "machine" if fake else Path("/")))
    kexec: Kexec = SystemKexec()
    if fake:
        kexec = FakeKexec(data_dir, data_dir, lambda: str(uuid.UUID(int=rng.getrandbits(128), version=4)), to_thread)
    return RamdiskParts(MachineHardware(hw, tree), boot_journal(data_dir, hw.boot_id()), tree, kexec)
