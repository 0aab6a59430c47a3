"""Running a host tool (`qemu-img`, `qemu`) from the instances code: no stdin, stdout dropped, the last line
of its stderr for the one sentence a failure becomes."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

MAX_STDERR = 4096


class ToolFailed(Exception):
    """The tool could not run, or exited non-zero: `line` is what it said last (or why it could not run)."""

    def __init__(self, line: str, returncode: int | None = None) -> None:
        super().__init__(line)
        self.line, self.returncode = line, returncode


async def run_tool(argv: Sequence[str]) -> None:
    """Run `argv` to its end; ToolFailed unless it exits 0."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
    except OSError as e:
        raise ToolFailed(f"cannot run {argv[0]}: {e.strerror}") from None
    _, err = await proc.communicate()
    if proc.returncode != 0:
        lines = err[-MAX_STDERR:].decode(errors="replace").strip().splitlines()
        raise ToolFailed(lines[-1] if lines else f"exit status {proc.returncode}", proc.returncode)
