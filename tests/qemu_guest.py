"""A small real guest for the qemu runtime's tests: the host's `linux-image-cloud-amd64` kernel and a busybox
initramfs built here, with whichever of the kernel's modules a test's /init loads (with their dependencies,
in order, from modules.dep). Needs qemu-system-x86, busybox-static and linux-image-cloud-amd64 (.ci/run
installs them).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import pytest

from agent.instances.admission import HostMemory, parse_meminfo
from agent.instances.confine import is_vmm_uid
from agent.instances.qemu import RECORD, QemuRuntime
from agent.offload import to_thread


def newc(entries: list[tuple[str, int, bytes]]) -> bytes:
    """A cpio archive in the kernel's `newc` format: (name, mode, data) entries, then the trailer."""
    out = bytearray()
    for ino, (name, mode, data) in enumerate([*entries, ("TRAILER!!!", 0, b"")], start=1):
        raw = name.encode() + b"\0"
        fields = [ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(raw), 0]
        out += b"070701" + b"".join(b"%08x" % f for f in fields) + raw
        out += b"\0" * (-len(out) % 4) + data
        out += b"\0" * (-len(out) % 4)
    return bytes(out)


def kernel() -> Path:
    found = sorted(Path("/boot").glob("vmlinuz-*-cloud-amd64"))
    if not found or shutil.which("qemu-system-x86_64") is None or not Path("/usr/bin/busybox").exists():
        pytest.fail("needs qemu-system-x86, busybox-static and linux-image-cloud-amd64 (.ci/run installs them)")
    return found[-1]


def boot_dir(data: Path, make_initrd: Callable[[Path], bytes]) -> Path:
    """`data`/instance-boot with the host's kernel as `vmlinuz` and `make_initrd(that kernel)` as `initrd`."""
    boot = data / "instance-boot"
    boot.mkdir(parents=True)
    vmlinuz = kernel()
    shutil.copyfile(vmlinuz, boot / "vmlinuz")
    (boot / "initrd").write_bytes(make_initrd(vmlinuz))
    return boot


def modules_dir(vmlinuz: Path) -> Path:
    return Path("/lib/modules") / vmlinuz.name.removeprefix("vmlinuz-")


def module_chain(vmlinuz: Path, *names: str) -> list[Path]:
    """The modules named (e.g. "virtio_balloon") and what they need, dependencies first, each once."""
    base = modules_dir(vmlinuz)
    deps: dict[str, list[str]] = {}
    for line in (base / "modules.dep").read_text().splitlines():
        mod, _, rest = line.partition(":")
        deps[mod] = rest.split()
    by_name = {Path(m).name.split(".ko")[0]: m for m in deps}
    out: list[str] = []

    def add(mod: str) -> None:
        if mod in out:
            return
        for d in reversed(deps.get(mod, [])):  # modules.dep lists the nearest need first
            add(d)
        out.append(mod)

    for n in names:
        if n not in by_name:
            pytest.fail(f"the kernel {vmlinuz.name} has no module {n} (linux-image-cloud-amd64's modules)")
        add(by_name[n])
    return [base / m for m in out]


def initrd(init: str, vmlinuz: Path, modules: tuple[str, ...] = ()) -> bytes:
    """An initramfs of busybox, `init` as /init, and the modules (with their needs) as /m/NN-name.ko, for
    /init to `insmod` in order: `for m in /m/*.ko; do insmod $m; done`."""
    entries = [(d, stat.S_IFDIR | 0o755, b"") for d in ("bin", "proc", "sys", "dev", "m")]
    entries.append(("bin/busybox", stat.S_IFREG | 0o755, Path("/usr/bin/busybox").read_bytes()))
    for i, path in enumerate(module_chain(vmlinuz, *modules) if modules else []):
        name = path.name.split(".ko")[0]
        data = path.read_bytes()
        if path.name.endswith(".xz") or path.name.endswith(".zst"):
            pytest.fail(f"{path} is compressed; busybox insmod cannot load it")
        entries.append((f"m/{i:02d}-{name}.ko", stat.S_IFREG | 0o644, data))
    entries.append(("init", stat.S_IFREG | 0o755, init.encode()))
    return newc(entries)


LOAD_MODULES = "for m in /m/*.ko; do /bin/busybox insmod $m; done"
"""The /init line that loads what `initrd` packed, in order."""


def vm_data_dir() -> Path:
    """A data directory for a test's qemu runtime that a confined VMM (its own uid) can reach: a fresh
    directory right under /tmp (sticky and searchable), since pytest's own tmp base is 0700. The caller
    removes it (`shutil.rmtree`)."""
    d = Path(tempfile.mkdtemp(prefix="bc-vm-test-", dir="/tmp"))
    d.chmod(0o711)  # searchable, not listable: what /var/lib is to a real data directory
    return d


async def console_says(path: Path, text: str, within_s: float = 90.0, *, regex: bool = False) -> str:
    """The console file once it holds `text` (a regex with `regex=True`); AssertionError with its ends when it
    does not within `within_s`. qemu appends to the file: nothing to wait on but its growth."""
    got = ""
    try:
        async with asyncio.timeout(within_s):
            while True:
                got = path.read_text(errors="replace") if path.exists() else ""
                if (re.search(text, got) is not None) if regex else (text in got):
                    return got
                await asyncio.sleep(0.2)
    except TimeoutError:
        raise AssertionError(f"the guest never printed {text!r}; its console: {got[:1500]} … {got[-300:]}") from None


def vmm_uid(root: Path, instance_id: str) -> int:
    """The VMM uid the instance's record holds (root reads it). Not a constant: a node picks the lowest uid no
    record holds and no process runs as, and other tests' guests may run meanwhile."""
    uid = json.loads((root / instance_id / RECORD).read_text())["uid"]
    assert is_vmm_uid(uid), uid
    return int(uid)


def kill_qemus(root: Path) -> None:
    """SIGKILL every qemu whose pid file is under `root`/<instance>/ (a test's teardown: qemu daemonizes)."""
    for pidfile in root.glob("*/qemu.pid"):
        try:
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
        except (OSError, ValueError):
            pass


class GuestHost:
    """What every real-guest test's host does with its runtime's directory `root`: a guest's qemu pid, its
    console, and killing every qemu at teardown."""

    root: Path

    def pid(self, iid: str) -> int:
        return int((self.root / iid / "qemu.pid").read_text())

    async def console_says(self, iid: str, text: str, within_s: float = 90.0, *, regex: bool = False) -> str:
        return await console_says(self.root / iid / "console.log", text, within_s, regex=regex)

    def kill_all(self) -> None:
        kill_qemus(self.root)

    def tcg_runtime(self, confine: bool | None = None) -> QemuRuntime:
        """The qemu runtime under `root` on TCG (no KVM on CI), stopping a guest after 1 s, not a minute."""
        return QemuRuntime(self.root, to_thread, accel=("tcg",), stop_grace_s=1.0, confine=confine)


async def host_meminfo() -> HostMemory:
    """The host's memory as admission reads it, from /proc/meminfo."""
    return parse_meminfo(await to_thread(Path("/proc/meminfo").read_text))


H = TypeVar("H", bound=GuestHost)


@contextmanager
def guest_host(make: Callable[[Path], H]) -> Iterator[H]:
    """A host made on a fresh `vm_data_dir()` (its VMMs run as their own users: they must reach the data
    directory); at the end every qemu under it is killed and the directory removed."""
    data = vm_data_dir()
    h = make(data / "d")
    try:
        yield h
    finally:
        h.kill_all()
        shutil.rmtree(data, ignore_errors=True)
