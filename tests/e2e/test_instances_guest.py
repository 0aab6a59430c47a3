"""A real guest (qemu, TCG) driven through the control plane: `bc serve`, `bc node --instance-runtime qemu`
(fake GPUs, real VMs) and the `bc` CLI, all real processes. The operator writes the spec, the node runs it,
`bc instances` shows what the guest does: RUNNING, PAUSED and resumed (the same qemu), STOPPED when the spec
says, and DELETED. In `make test-slow`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.qemu_guest import initrd, kernel, vm_data_dir

from .harness import Lab

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MARKER = "BC-E2E-GUEST"
INIT = f"""#!/bin/busybox sh
/bin/busybox mkdir -p /proc
/bin/busybox mount -t proc proc /proc
/bin/busybox echo {MARKER} $(/bin/busybox cat /proc/sys/kernel/random/boot_id)
while true; do /bin/busybox sleep 5; done
"""


@pytest.fixture
def guest_lab() -> Iterator[Lab]:
    """A lab whose directories a confined VMM (its own uid) can reach (pytest's tmp base is 0700)."""
    root = vm_data_dir()
    lab = Lab(root)
    try:
        yield lab
    finally:
        lab.close()
        for pidfile in root.glob("node-*/instances/*/qemu.pid"):
            try:
                os.kill(int(pidfile.read_text()), signal.SIGKILL)
            except (OSError, ValueError):
                pass
        print(lab.dump_logs())
        shutil.rmtree(root, ignore_errors=True)


def vm(state: str) -> dict[str, Any]:
    return {
        "id": "web-1", "runtime": "qemu", "vcpus": 1, "memory_mib": 256, "kernel": "vmlinuz", "initrd": "initrd",
        "cmdline": "console=ttyS0 quiet panic=-1", "state": state,
    }  # fmt: skip


def spec_set(lab: Lab, *instances: dict[str, Any]) -> int:
    return int(lab.bc("spec", "set", "n1", "instances", json.dumps({"instances": list(instances)}))["generation"])


def states(lab: Lab) -> list[tuple[str, str]]:
    return [(i["id"], i["state"]) for i in lab.bc("instances", "list", "n1")]


def console(lab: Lab) -> str:
    path = lab.node_dir("n1") / "instances" / "web-1" / "console.log"
    return path.read_text(errors="replace") if path.exists() else ""


def ended(pid: int) -> bool:
    """The process is gone, or a zombie its new parent (qemu daemonized) has not reaped yet."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status


def qemu_pid(lab: Lab) -> int:
    return int((lab.node_dir("n1") / "instances" / "web-1" / "qemu.pid").read_text())


@pytest.mark.timeout(300)  # a TCG boot on a loaded machine
def test_a_real_guest_through_the_control_plane(guest_lab: Lab) -> None:
    lab = guest_lab
    lab.serve()
    lab.join("n1")
    boot = lab.node_dir("n1") / "instance-boot"
    boot.mkdir()
    vmlinuz = kernel()
    (boot / "vmlinuz").write_bytes(vmlinuz.read_bytes())
    (boot / "initrd").write_bytes(initrd(INIT, vmlinuz))
    for f in boot.iterdir():
        f.chmod(0o644)
    # busybox ignores the ACPI power button: a short grace, so the stop ends it soon after
    lab.node("n1", extra=["--instance-runtime", "qemu", "--instance-accel", "tcg", "--instance-stop-grace", "2"])

    lab.wait_converged("n1", spec_set(lab, vm("RUNNING")), timeout=60)
    assert states(lab) == [("web-1", "RUNNING")]
    lab.wait_for("the guest's console line", lambda: MARKER in console(lab) or None, timeout=90, interval=0.2)
    pid = qemu_pid(lab)
    shown = lab.bc("instances", "show", "n1", "web-1")
    assert shown["managed"] is True and shown["memory_mib"] == 256 and shown["balloon_mib"] == 0

    lab.wait_converged("n1", spec_set(lab, vm("PAUSED")), timeout=60)
    assert states(lab) == [("web-1", "PAUSED")]
    lab.wait_converged("n1", spec_set(lab, vm("RUNNING")), timeout=60)
    assert states(lab) == [("web-1", "RUNNING")] and qemu_pid(lab) == pid  # a resume is not a boot
    assert console(lab).count(MARKER) == 1

    lab.wait_converged("n1", spec_set(lab, vm("STOPPED")), timeout=90)
    assert states(lab) == [("web-1", "STOPPED")]
    assert ended(pid)

    lab.wait_converged("n1", spec_set(lab, vm("DELETED")), timeout=60)
    assert states(lab) == []
    assert not (lab.node_dir("n1") / "instances" / "web-1").exists()
