"""`run_on_pty` on a terminal the test holds: the command's output reaches the terminal and the tee alike, the
terminal is in raw mode while it runs, and it is restored when the command ends and when SIGTERM ends it."""

from __future__ import annotations

import asyncio
import os
import pty
import signal
import sys
import termios

SCRIPT = """
import asyncio, sys
from bc.cli.pty_session import run_on_pty
teed = bytearray()
code = asyncio.run(run_on_pty(sys.argv[1:], teed.extend))
sys.stderr.write(f"code={code} teed={bytes(teed)!r}")
"""


async def _run(argv: list[str], typed: bytes = b"", stop: bool = False) -> tuple[int, bytes, bytes, bool, bool]:
    """(exit code, what the terminal showed, stderr, raw while running, restored after)."""
    master, slave = pty.openpty()
    cooked = termios.tcgetattr(slave)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", SCRIPT, *argv, stdin=slave, stdout=slave, stderr=asyncio.subprocess.PIPE
    )
    loop = asyncio.get_running_loop()
    shown = bytearray()
    marker = asyncio.Event()

    def drain() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                return
            if not data:
                return
            shown.extend(data)
            if b"ready" in shown:
                loop.call_soon_threadsafe(marker.set)

    screen = asyncio.create_task(asyncio.to_thread(drain))
    try:
        async with asyncio.timeout(30):
            await marker.wait()
            raw = not termios.tcgetattr(slave)[3] & termios.ICANON
            if typed:
                os.write(master, typed)
            if stop:
                proc.send_signal(signal.SIGTERM)
            assert proc.stderr is not None
            err = await proc.stderr.read()
            code = await proc.wait()
            restored = termios.tcgetattr(slave) == cooked
            os.close(slave)
            await screen
    finally:
        os.close(master)
    return code, bytes(shown), err, raw, restored


async def test_output_reaches_the_terminal_and_the_tee_and_the_terminal_is_restored() -> None:
    code, shown, err, raw, restored = await _run(["sh", "-c", "echo ready; read x; echo got-$x; exit 5"], b"abc\r")
    assert raw and restored
    assert code == 0 and b"code=5" in err  # the command's exit code is run_on_pty's
    assert b"got-abc" in shown and b"got-abc" in err.partition(b"teed=")[2]


async def test_sigterm_ends_the_command_and_restores_the_terminal() -> None:
    code, shown, err, raw, restored = await _run(["sh", "-c", "echo ready; exec sleep 30"], stop=True)
    assert raw and restored
    assert code == 0 and b"code=-15" in err and b"ready" in shown
