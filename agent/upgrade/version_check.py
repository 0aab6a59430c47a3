"""Run a staged release's own `--version` before the swap, and compare it with the release's version.

The signature says which version the release is; the binary says which it
is. A release whose binary answers another version (a build mislabelled at
publish, the wrong file uploaded under a good signature) is refused before
`current` ever names it: a node never swaps in a binary that is not the
version its record will claim. It runs only after the sha256 matched the
signed one, so only a binary the release key vouched for is ever executed,
in the install dir, with a small fixed environment, no stdin, and a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path

VERSION_TIMEOUT_S = 60.0
"""A one-file PyInstaller binary unpacks itself first: seconds on a loaded host, never a minute."""
MAX_OUTPUT = 64 * 1024


class VersionCheckFailed(Exception):
    """The staged binary did not answer `--version` with a version; the message is one sentence."""


def reported_version(output: str) -> str:
    """The version in `bc --version`'s first line (`bc 1.4.0`); empty when the line does not look like one."""
    first = output.strip().splitlines()[0] if output.strip() else ""
    words = first.split()
    return words[-1] if len(words) >= 2 else ""


def mismatch(output: str, version: str) -> str | None:
    """One sentence when the staged binary's `--version` output does not name `version`; None when it does."""
    said = reported_version(output)
    if said == version:
        return None
    shown = said or (output.strip().splitlines()[0][:80] if output.strip() else "nothing")
    return f"the staged binary says it is {shown!r}, not release version {version!r}; it was not swapped in"


def _env() -> dict[str, str]:
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYINSTALLER_RESET_ENVIRONMENT": "1"}
    if "TMPDIR" in os.environ:  # where a one-file binary unpacks itself
        env["TMPDIR"] = os.environ["TMPDIR"]
    return env


async def staged_version_output(binary: Path, *, timeout_s: float = VERSION_TIMEOUT_S) -> str:
    """What `binary --version` prints (run in its own dir); VersionCheckFailed when it cannot run or fails."""
    try:
        proc = await asyncio.create_subprocess_exec(
            str(binary),
            "--version",
            cwd=str(binary.parent),
            env=_env(),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError as e:
        raise VersionCheckFailed(f"the staged binary does not run: {e.strerror or e}") from None
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(timeout_s):
            out = b""
            while len(out) < MAX_OUTPUT:  # one read returns what one write wrote: read to the end
                chunk = await proc.stdout.read(MAX_OUTPUT - len(out))
                if not chunk:
                    break
                out += chunk
            code = await proc.wait()
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # a one-file binary is a bootloader and its child
        await proc.wait()
        raise VersionCheckFailed(f"the staged binary did not answer --version within {timeout_s:g} s") from None
    if code != 0:
        raise VersionCheckFailed(f"the staged binary's --version exited with status {code}")
    return out.decode("utf-8", "replace")
