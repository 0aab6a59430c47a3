"""A real guest (TCG) booted with a root disk from a tenant image (raw, and qcow2) and a persistent volume, and a volume
attached and detached live (QMP) while it runs. The image is served over real https (127.0.0.1, a real CA).

The guest's /init loads the host kernel's virtio modules, prints the first bytes of /dev/vda (the raw
image's marker, through the qcow2 overlay) and then, every half second, each /sys/block/vd* with its serial,
so the test reads what the guest sees on the serial console. In `make test-slow`.
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import stat
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent.converge.instance_disks import InstanceDisks
from agent.converge.instances import InstancesConverger
from agent.converge.run import CONVERGED, PROGRESSING
from agent.instances.images import ImageStore
from agent.instances.overlay import Overlays
from agent.instances.qemu import QemuRuntime
from agent.instances.volumes import VolumeStore
from agent.offload import to_thread
from bc.protocol.pb import common_pb2, spec_pb2
from bc.seams.clock import LoopClock
from tests.integration.test_instance_disks import Server, pki, server  # noqa: F401 (fixtures)
from tests.qemu_guest import GuestHost, kernel, newc, vm_data_dir

pytestmark = pytest.mark.slow

ROOT_MARKER = b"BC-ROOT-DISK-FROM-IMAGE"
MODULES = (
    "kernel/drivers/virtio/virtio_ring.ko",
    "kernel/drivers/virtio/virtio.ko",
    "kernel/drivers/virtio/virtio_pci_modern_dev.ko",
    "kernel/drivers/virtio/virtio_pci_legacy_dev.ko",
    "kernel/drivers/virtio/virtio_pci.ko",
    "kernel/drivers/block/virtio_blk.ko",
)
INIT = """#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t sysfs sysfs /sys
/bin/busybox mount -t devtmpfs dev /dev
for m in virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci virtio_blk; do
  /bin/busybox insmod /$m.ko
done
/bin/busybox sleep 1
/bin/busybox echo BC-ROOT $(/bin/busybox head -c 23 /dev/vda)
while true; do
  line=BC-DISKS
  for b in /sys/block/vd*; do
    line="$line $(/bin/busybox basename $b)=$(/bin/busybox cat $b/serial):$(/bin/busybox cat $b/size)"
  done
  /bin/busybox echo "$line ."
  /bin/busybox sleep 0.5
done
"""


class Guest(GuestHost):
    def __init__(self, data: Path, ca_pem: bytes) -> None:
        self.boot = data / "instance-boot"
        self.boot.mkdir(parents=True)
        vmlinuz = kernel()
        (self.boot / "vmlinuz").write_bytes(vmlinuz.read_bytes())
        mods = Path("/lib/modules") / vmlinuz.name.removeprefix("vmlinuz-")
        files = [(d, stat.S_IFDIR | 0o755, b"") for d in ("bin", "proc", "sys", "dev")]
        files.append(("bin/busybox", stat.S_IFREG | 0o755, Path("/usr/bin/busybox").read_bytes()))
        files += [(Path(m).name, stat.S_IFREG | 0o644, (mods / m).read_bytes()) for m in MODULES]
        files.append(("init", stat.S_IFREG | 0o755, INIT.encode()))
        (self.boot / "initrd").write_bytes(newc(files))
        self.root = data / "instances"
        self.runtime = QemuRuntime(self.root, to_thread, accel=("tcg",), stop_grace_s=1.0)
        self.changed = asyncio.Event()
        images = ImageStore(data / "images", to_thread, LoopClock(), ca_pem=ca_pem, on_change=self.changed.set)
        self.disks = InstanceDisks(
            images, Overlays(self.root, to_thread), VolumeStore(data / "volumes", to_thread, min_reserve=0)
        )
        self.conv = InstancesConverger(
            {"qemu": self.runtime}, self.boot, self.memory, list, to_thread, disks=self.disks
        )

    async def memory(self) -> None:
        return None


@pytest.fixture
async def guest(pki: tuple[bytes, bytes, bytes]) -> AsyncIterator[Guest]:  # noqa: F811
    data = vm_data_dir()  # its VMM runs as its own user (agent.instances.confine): it must reach the data dir
    g = Guest(data / "d", pki[0])
    try:
        yield g
    finally:
        await g.runtime.delete("vm1")
        await g.disks.images.close()
        shutil.rmtree(data, ignore_errors=True)


def image_bytes(fmt: str, tmp: Path) -> bytes:
    """A 1 MiB disk whose first bytes are the marker, as raw or converted to qcow2 by qemu-img."""
    raw = ROOT_MARKER + b"\0" * ((1 << 20) - len(ROOT_MARKER))
    if fmt == "raw":
        return raw
    (tmp / "root.raw").write_bytes(raw)
    subprocess.run(
        ["qemu-img", "convert", "-q", "-f", "raw", "-O", "qcow2", str(tmp / "root.raw"), str(tmp / "root.qcow2")],
        check=True,
    )
    return (tmp / "root.qcow2").read_bytes()


@pytest.mark.parametrize("fmt", ["raw", "qcow2"])
async def test_a_guest_boots_an_image_overlay_with_a_volume_and_takes_another_live(
    guest: Guest,
    server: Server,  # noqa: F811
    fmt: str,
    tmp_path: Path,
) -> None:
    data = image_bytes(fmt, tmp_path)
    server.files["root"] = data
    img = spec_pb2.TenantImage(name="root", url=server.url("root"), sha256=hashlib.sha256(data).hexdigest(), format=fmt)
    logs = spec_pb2.Volume(id="logs", serial="logs-2", size_bytes=2 << 20)
    vols = [spec_pb2.Volume(id="data", serial="data-1", size_bytes=1 << 20), logs]

    def vm(*attach: str) -> spec_pb2.InstancesSection:
        inst = spec_pb2.Instance(
            id="vm1", runtime="qemu", vcpus=1, memory_mib=256, kernel="vmlinuz", initrd="initrd",
            cmdline="console=ttyS0 quiet panic=-1", image="root", disk_size_bytes=4 << 20,
            volumes=[spec_pb2.VolumeAttachment(volume=v) for v in attach],
        )  # fmt: skip
        return spec_pb2.InstancesSection(instances=[inst], images=[img], volumes=vols)

    assert (await guest.conv.converge(vm("data"), 1)).state == PROGRESSING
    async with asyncio.timeout(30):
        await guest.changed.wait()
    assert (await guest.conv.converge(vm("data"), 2)).state == CONVERGED
    shown: common_pb2.InstanceStatus = guest.conv.statuses[0]
    assert (shown.state, list(shown.volumes), shown.image_sha256) == ("RUNNING", ["data"], img.sha256)
    console = await guest.console_says("vm1", "BC-DISKS vda=:8192 vdb=data-1:2048 .")
    assert f"BC-ROOT {ROOT_MARKER.decode()}" in console

    assert (await guest.conv.converge(vm("data", "logs"), 3)).state == CONVERGED  # attached live: same qemu
    await guest.console_says("vm1", "BC-DISKS vda=:8192 vdb=data-1:2048 vdc=logs-2:4096 .")
    assert list(guest.conv.statuses[0].volumes) == ["data", "logs"]

    assert (await guest.conv.converge(vm("logs"), 4)).state == CONVERGED  # and data detached live
    await guest.console_says("vm1", "BC-DISKS vda=:8192 vdc=logs-2:4096 .")
    assert list(guest.conv.statuses[0].volumes) == ["logs"]

    logs.size_bytes = 4 << 20  # grown: the file first, then the running guest (block_resize)
    assert (await guest.conv.converge(vm("logs"), 5)).state == CONVERGED
    await guest.console_says("vm1", "BC-DISKS vda=:8192 vdc=logs-2:8192 .")
    assert (guest.root.parent / "volumes" / "logs.raw").stat().st_size == 4 << 20
