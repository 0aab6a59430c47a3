"""boot.kexec on a disk sfdisk partitioned, through the fake kexec edge: the plan the edge gets, and the agent's end.

On the real event loop (sfdisk is a process), so under tests/integration rather than the virtual-time unit tests.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from agent.hw.fake import FakeHardware
from agent.kinds import REGISTRY, KindContext
from agent.offload import to_thread
from agent.ramdisk.kexec import KEXEC_FILE, FakeKexec
from agent.ramdisk.machine import MachineTree
from bc.protocol.pb import kinds_pb2
from tests.ramdisk_disks import add_sys_disk
from tests.unit.kinds.kind_helpers import pack

MIB = 1 << 20


@pytest.mark.skipif(shutil.which("sfdisk") is None, reason="needs util-linux's sfdisk (.ci/run installs fdisk)")
async def test_boot_kexec_hands_the_partition_to_the_kexec_edge_and_the_agent_ends(tmp_path: Path) -> None:
    tree = tmp_path / "machine"
    dev = add_sys_disk(tree, "vda", 16 * MIB)
    subprocess.run(["sfdisk", "-q", str(dev)], input=b"label: gpt\n2048,4096,L\n8192,,L\n", check=True)
    data = tmp_path / "data"
    data.mkdir()
    hw = FakeHardware("hgx-h100-8", "r1", state_dir=data)
    before = hw.boot_id()
    gone = asyncio.Event()
    ctx = KindContext(
        node_id="r1",
        data_dir=data,
        hw=hw,
        cdi_dir=tmp_path / "cdi",
        boot_id=before,
        machine=MachineTree(tree),
        kexec=FakeKexec(data, data, lambda: "5e7e7e7e-0000-4000-8000-000000000001", to_thread),
        gone=gone.set,
    )
    executor = REGISTRY["boot.kexec"]
    missing = kinds_pb2.BootKexecRequest(disk="vda", partition=3, kernel="/boot/vmlinuz")
    res = await executor.run(ctx, executor.parse(pack(missing)))
    assert (res.ok, res.reason) == (False, "no-such-partition") and not gone.is_set(), res
    req = kinds_pb2.BootKexecRequest(disk="vda", partition=2, kernel="/vmlinuz", initrd="/initrd", cmdline="ro")
    task = asyncio.create_task(executor.run(ctx, executor.parse(pack(req))))
    await asyncio.wait_for(gone.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task  # a kexec that worked never reports: the agent ends around it
    plan = json.loads((data / KEXEC_FILE).read_text())
    table = json.loads(subprocess.run(["sfdisk", "--json", str(dev)], capture_output=True, check=True).stdout)
    sectors = table["partitiontable"]["partitions"][1]["size"]
    assert plan == {
        "device": str(tree / "dev" / "vda"),
        "offset_bytes": 8192 * 512,
        "size_bytes": sectors * 512,
        "kernel": "/vmlinuz",
        "initrd": "/initrd",
        "cmdline": "ro",
    }
    assert hw.boot_id() != before, "the next start of the agent is a new boot"
