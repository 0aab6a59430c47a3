"""The kexec edge: boot the installed OS's kernel from the deployed disk, without a firmware reboot.

`Kexec.boot` never returns when it worked (the ramdisk is gone with its process), and returns the reason
when it could not start the boot. Two implementations:

* `SystemKexec` mounts the partition read-only through a loop at its offset (no partition device node
  needed), `kexec -l` the kernel and initrd with the command line, unmounts, then `kexec -e`;
* `FakeKexec` (`bc node --fake-hw`, tests) writes the plan to `<data dir>/kexec.json`, starts a new fake boot
  (the next agent start reads a new boot id, so its journal is a new one), and ends the agent as a real
  kexec would (`gone`): the fake machine's next OS is whatever the test starts next.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from agent.hw.base import run_process
from agent.hw.fake import boot_anew
from agent.offload import Offload

KEXEC_FILE = "kexec.json"
TOOL_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class KexecPlan:
    device: str
    """The disk's device node (`/dev/sda`)."""
    offset_bytes: int
    size_bytes: int
    """Where the partition holding the kernel lies on the disk."""
    kernel: str
    initrd: str
    cmdline: str


class Kexec(Protocol):
    async def boot(self, plan: KexecPlan, *, gone: Callable[[], None]) -> str:
        """Boot `plan`: never returns once the new kernel runs; returns why not otherwise. `gone` is what
        the end of this agent means to the caller (a fake calls it; a real kexec has no after)."""
        ...


class SystemKexec:
    async def boot(self, plan: KexecPlan, *, gone: Callable[[], None]) -> str:
        with tempfile.TemporaryDirectory(prefix="bc-kexec-") as mnt:
            opts = f"ro,loop,offset={plan.offset_bytes},sizelimit={plan.size_bytes}"
            res = await run_process(["mount", "-o", opts, plan.device, mnt], timeout_s=TOOL_TIMEOUT_S)
            if res.returncode != 0:
                return f"mount of the boot partition failed: {res.tail(300)}"
            try:
                argv = ["kexec", "-l", str(Path(mnt) / plan.kernel.lstrip("/")), f"--append={plan.cmdline}"]
                if plan.initrd:
                    argv.append(f"--initrd={Path(mnt) / plan.initrd.lstrip('/')}")
                res = await run_process(argv, timeout_s=TOOL_TIMEOUT_S)
            finally:
                await run_process(["umount", mnt], timeout_s=TOOL_TIMEOUT_S)
            if res.returncode != 0:
                return f"kexec -l failed: {res.tail(300)}"
        res = await run_process(["kexec", "-e"], timeout_s=TOOL_TIMEOUT_S)
        return f"kexec -e returned: {res.tail(300)}"  # it only returns when the jump did not happen


class FakeKexec:
    def __init__(self, data_dir: Path, state_dir: Path, new_boot_id: Callable[[], str], offload: Offload) -> None:
        self.data_dir, self.state_dir, self.new_boot_id, self.offload = data_dir, state_dir, new_boot_id, offload

    async def boot(self, plan: KexecPlan, *, gone: Callable[[], None]) -> str:
        body = json.dumps(asdict(plan), sort_keys=True) + "\n"
        await self.offload((self.data_dir / KEXEC_FILE).write_text, body, "utf-8")
        await self.offload(boot_anew, self.state_dir, self.new_boot_id())
        gone()
        await asyncio.Future()  # the ramdisk is gone: the agent stops around this
        return "unreachable"
