"""Snapshots of a real guest under qemu (TCG): memory and disk, uploaded over real https, restored into clones.

The guest (the host's cloud kernel, a busybox initramfs built here) loads virtio_blk, writes a marker onto
its disk on first boot (and prints it when it finds one), then prints `BC-COUNT n` every second, and
answers a hot-added `bc-rebind` disk as the reference's guest half does (`BCREBOUND <nonce>` at the start of
the last 4 KiB). A memory snapshot restored into a clone goes on counting on the clone's console with no
boot at all; the clone then takes its own identity through the rebind disk. A disk-only snapshot restores
into a clone that boots and reads the source's marker from its disk. In `make test-slow`.
"""

from __future__ import annotations

import json
import re
import stat
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agent.converge.run import CONVERGED, PROGRESSING
from agent.instances.qemu import CONSOLE, QemuRuntime
from agent.instances.qemu_snapshot import QemuSnapshots
from agent.instances.runtime import DomainConfig
from agent.instances.transfer import Limits
from bc.protocol.pb import spec_pb2
from tests.instance_parts import guest
from tests.qemu_guest import GuestHost, boot_dir, guest_host, host_meminfo, modules_dir, newc
from tests.snapshot_https import ObjectStore
from tests.snapshot_node import SnapshotNode

pytestmark = pytest.mark.slow

MODULES = (
    "kernel/drivers/virtio/virtio.ko",
    "kernel/drivers/virtio/virtio_ring.ko",
    "kernel/drivers/virtio/virtio_pci_legacy_dev.ko",
    "kernel/drivers/virtio/virtio_pci_modern_dev.ko",
    "kernel/drivers/virtio/virtio_pci.ko",
    "kernel/drivers/block/virtio_blk.ko",
)
INIT = """#!/bin/busybox sh
B=/bin/busybox
$B mkdir -p /proc /sys /dev
$B mount -t proc proc /proc
$B mount -t sysfs sysfs /sys
$B mount -t devtmpfs dev /dev
for m in virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci virtio_blk; do $B insmod /$m.ko; done
boot=$($B cat /proc/sys/kernel/random/boot_id)
$B echo BC-GUEST-UP $boot
if [ -b /dev/vda ]; then
  if [ "$($B head -c 7 /dev/vda)" = BC-DISK ]; then $B echo BC-DISK-READ $($B head -n 1 /dev/vda)
  else $B echo "BC-DISK $boot" | $B dd of=/dev/vda conv=fsync 2>/dev/null; $B echo BC-DISK-WRITTEN $boot; fi
fi
i=0
seen=
while true; do
  $B echo BC-COUNT $i
  i=$((i+1))
  for s in /sys/block/vd*/serial; do
    if [ "$($B cat $s 2>/dev/null)" = bc-rebind ]; then
      dev=/dev/$($B basename $($B dirname $s))
      n=$($B tar -xOf $dev nonce 2>/dev/null)
      if [ -n "$n" ] && [ "$n" != "$seen" ]; then
        a=$($B tar -xOf $dev account)
        $B echo "BCREBOUND $n" | $B dd of=$dev bs=4096 seek=255 conv=fsync 2>/dev/null
        $B echo BC-REBOUND $a
        seen=$n
      fi
    fi
  done
  $B sleep 1
done
"""
BUNDLE = json.dumps({"v": 1, "account": "tenant", "principals": ["restore-1"]}).encode()
COUNT = re.compile(r"BC-COUNT (\d+)")


class Host(GuestHost, SnapshotNode):
    runtime: QemuRuntime
    woke_within_s = 120.0

    def __init__(self, data: Path, store: ObjectStore) -> None:
        def initramfs(vmlinuz: Path) -> bytes:
            mods = modules_dir(vmlinuz)
            entries = [(d, stat.S_IFDIR | 0o755, b"") for d in ("bin", "proc", "sys", "dev", "tmp")]
            entries.append(("bin/busybox", stat.S_IFREG | 0o755, Path("/usr/bin/busybox").read_bytes()))
            entries += [(Path(m).name, stat.S_IFREG | 0o644, (mods / m).read_bytes()) for m in MODULES]
            entries.append(("init", stat.S_IFREG | 0o755, INIT.encode()))
            return newc(entries)

        self.boot = boot_dir(data, initramfs)
        self.root = data / "instances"
        runtime = self.tcg_runtime()
        super().__init__(
            data,
            self.boot,
            runtime,
            QemuSnapshots(runtime),
            host_meminfo,
            ca_pem=store.ca_pem,
            limits=Limits(min_bytes=1 << 20, window_s=30.0, max_s=600.0),
            cdi_dir=data / "cdi",
            answer_s=60.0,
            poll_s=0.2,
        )

    async def converge(self, *instances: spec_pb2.Instance) -> tuple[int, str]:
        result = await self.section(*instances)
        return result.reported_state, result.message


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[ObjectStore]:
    async with ObjectStore(tmp_path) as s:
        yield s


@pytest.fixture
async def host(store: ObjectStore) -> AsyncIterator[Host]:
    with guest_host(lambda data: Host(data, store)) as h:
        try:
            yield h
        finally:
            await h.close()


def vm(iid: str, **kw: Any) -> spec_pb2.Instance:
    return guest(iid, **kw)


async def source(host: Host, tmp: Path) -> str:
    """`src` running on a qcow2 disk of its own (the spec names no image: tenant images are another part);
    its boot id once it wrote its marker onto the disk."""
    disk = host.data / "src.qcow2"  # in the data directory: a confined VMM reaches it
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(disk), "64M"], check=True)
    await host.runtime.define(
        DomainConfig("src", 1, 256, host.boot / "vmlinuz", host.boot / "initrd", vm("src").cmdline, disk=disk)
    )
    await host.runtime.start("src", paused=False)
    got = await host.console_says("src", r"BC-COUNT 2\b", regex=True)
    written = re.search(r"BC-DISK-WRITTEN (\S+)", got)
    assert written, got
    assert (await host.converge(vm("src")))[0] == CONVERGED  # named in the spec, so it is left running
    return written.group(1)


async def test_a_memory_snapshot_continues_in_a_clone_which_takes_its_own_identity(
    host: Host, store: ObjectStore, tmp_path: Path
) -> None:
    await source(host, tmp_path)
    got = await host.snapshot("src", store.url("/o/mem?sig=s3cr3t"), memory=True)
    assert got.ok, got.message
    sha = str(got.result["sha256"])
    counted = [int(n) for n in COUNT.findall((host.root / "src" / CONSOLE).read_text())]
    # the source was resumed after the snapshot: it keeps counting
    await host.console_says("src", rf"BC-COUNT {counted[-1] + 2}\b", regex=True)

    host.port.values["copy-id"] = BUNDLE
    spec = (
        vm("src"),
        vm(
            "copy",
            restore_from=spec_pb2.RestoreFrom(url=store.url("/o/mem"), sha256=sha),
            identity_rebind_ref="copy-id",
        ),
    )
    assert (await host.converge(*spec))[0] == PROGRESSING
    await host.woke()  # downloaded
    state, message = await host.converge(*spec)
    assert state == CONVERGED, message
    assert (host.status("copy").state, host.status("copy").restored_from) == ("RUNNING", sha)
    assert not (host.root / "copy" / "memory.state").exists()  # the next start boots the restored disk
    console = await host.console_says("copy", r"BC-COUNT \d+", regex=True)
    first = int(COUNT.findall(console)[0])
    assert first >= 2 and first <= counted[-1] + 1  # it carried on from the memory state...
    assert "BC-GUEST-UP" not in console and "Linux version" not in console  # ...with no boot

    await host.woke()  # the rebind answered
    await host.converge(*spec)
    assert host.status("copy").identity_rebound_ref == "copy-id"
    await host.console_says("copy", "BC-REBOUND tenant")  # the guest read the bundle before it answered
    assert not (host.root / "copy" / "rebind.img").exists()
    assert host.status("src").identity_rebound_ref == ""


async def test_a_disk_snapshot_restores_into_a_clone_that_boots_from_it(
    host: Host, store: ObjectStore, tmp_path: Path
) -> None:
    boot_id = await source(host, tmp_path)
    got = await host.snapshot("src", store.url("/o/disk"), memory=False)
    assert got.ok, got.message
    assert host.status("src").state == "RUNNING"
    spec = (
        vm("src"),
        vm("copy", restore_from=spec_pb2.RestoreFrom(url=store.url("/o/disk"), sha256=str(got.result["sha256"]))),
    )
    await host.converge(*spec)
    await host.woke()
    state, message = await host.converge(*spec)
    assert state == CONVERGED, message
    console = await host.console_says("copy", r"BC-DISK-READ", regex=True)
    assert f"BC-DISK-READ BC-DISK {boot_id}" in console and "BC-GUEST-UP" in console
