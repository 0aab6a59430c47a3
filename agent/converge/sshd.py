"""The access converger's seam to the host's OpenSSH: build a KRL, test sshd's config, reload sshd.

Every call is a subprocess through the agent's async runner
(`agent.hw.base.run_process`: no shell, killed with its await), so the loop
never blocks on a tool:

* `build_krl` runs `ssh-keygen -k -f OUT -s CA1 SPEC`, then `-u -s CAn` for
  each further CA key, so every serial is revoked under every CA; with no CA
  key it builds an empty KRL (no serial can be revoked without one, and no
  certificate is trusted without one either). Its scratch files live in a
  temporary directory under the SSH directory.
* `check` runs `sshd -t -f CONFIG` (the host's `sshd_config`, which includes
  the drop-in) and returns sshd's own message when it refuses.
* `reload` runs the `--sshd-reload-cmd` (default `systemctl reload ssh`); an
  empty command reloads nothing (a fake host has no sshd to reload).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agent.hw.base import run_process
from agent.hw.slices import RunProcess
from agent.offload import Offload, to_thread

SSHD_CONFIG = Path("/etc/ssh/sshd_config")
DEFAULT_RELOAD = ("systemctl", "reload", "ssh")
TOOL_TIMEOUT_S = 30.0


class ToolError(OSError):
    """A tool is missing or failed: the message is what it said."""


def find_tool(name: str) -> str:
    """The tool's path: on PATH, else in /usr/sbin or /usr/bin (a non-root PATH often lacks sbin)."""
    found = shutil.which(name) or next(
        (str(p) for p in (Path("/usr/sbin") / name, Path("/usr/bin") / name) if p.exists()), None
    )
    if found is None:
        raise ToolError(f"{name} is not installed on this host (apt-get install openssh-server)")
    return found


@dataclass
class SshdTools:
    sshd_config: Path = SSHD_CONFIG
    reload_cmd: Sequence[str] = DEFAULT_RELOAD
    run: RunProcess = run_process
    offload: Offload = to_thread
    reloads: int = field(default=0, init=False)
    """How many reloads ran (for tests and logs)."""

    async def build_krl(self, scratch_parent: Path, ca_keys: Sequence[str], spec: bytes) -> bytes:
        """The KRL revoking `spec`'s serials under every key of `ca_keys` (an empty KRL with none)."""
        keygen = find_tool("ssh-keygen")
        tmp = Path(await self.offload(tempfile.mkdtemp, prefix=".krl-", dir=scratch_parent))
        try:
            spec_path, out = tmp / "spec", tmp / "krl"
            await self.offload(spec_path.write_bytes, spec if ca_keys else b"")
            steps: list[list[str]] = []
            for i, key in enumerate(ca_keys):
                ca_path = tmp / f"ca{i}.pub"
                await self.offload(ca_path.write_text, key + "\n")
                steps.append([keygen, "-k", *(["-u"] if i else []), "-f", str(out), "-s", str(ca_path), str(spec_path)])
            if not steps:
                steps.append([keygen, "-k", "-f", str(out), str(spec_path)])
            for argv in steps:
                res = await self.run(argv, timeout_s=TOOL_TIMEOUT_S)
                if res.returncode != 0:
                    raise ToolError(f"ssh-keygen -k failed: {res.tail()}")
            return await self.offload(out.read_bytes)
        finally:
            await self.offload(shutil.rmtree, tmp, ignore_errors=True)

    async def check(self) -> str | None:
        """None when `sshd -t` accepts the host's configuration, else what sshd said."""
        res = await self.run([find_tool("sshd"), "-t", "-f", str(self.sshd_config)], timeout_s=TOOL_TIMEOUT_S)
        if res.returncode == 0:
            return None
        return f"sshd -t refused the configuration: {res.tail(1000)}" if res.tail() else "sshd -t refused it"

    async def reload(self) -> None:
        if not self.reload_cmd:
            return
        res = await self.run(list(self.reload_cmd), timeout_s=TOOL_TIMEOUT_S)
        if res.returncode != 0:
            raise ToolError(f"{' '.join(self.reload_cmd)} failed (exit {res.returncode}): {res.tail(500)}")
        self.reloads += 1
