"""A command on a pty this process owns, as `script(1)` runs one: what the pty writes goes to this terminal and to
a tee (`bc shell --record`'s typescript, docs/access.md "Typescripts").

The operator's terminal is put in raw mode (its keys reach the command as typed, Ctrl-C included) and restored on
every way out: the command's end, an error, SIGTERM/SIGHUP/SIGINT (each ends the command, so the `finally` runs).
Its window size is copied to the pty at the start and again at each SIGWINCH, which the command is sent too (it
runs in a session of its own, without this terminal as its controlling one). Every read and write is on the event
loop, on non-blocking descriptors (their blocking mode is restored), so nothing blocks it; a regular file on
stdin is read off the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import pty
import signal
import stat
import termios
import tty
from collections.abc import Callable

CHUNK = 64 * 1024
DRAIN_S = 2.0
"""How long the pty's last output is awaited after the command exits (its children may hold the pty)."""


async def _ready(add: Callable[..., None], remove: Callable[[int], object], fd: int) -> None:
    fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def wake() -> None:
        if not fut.done():
            fut.set_result(None)

    add(fd, wake)
    try:
        await fut
    finally:
        remove(fd)


async def _read(fd: int) -> bytes:
    """Up to CHUNK bytes of a non-blocking fd, b'' at its end (EIO: a pty's other side is closed)."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            return os.read(fd, CHUNK)
        except BlockingIOError:
            await _ready(loop.add_reader, loop.remove_reader, fd)
        except OSError:
            return b""


async def _write(fd: int, data: bytes) -> None:
    loop = asyncio.get_running_loop()
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            await _ready(loop.add_writer, loop.remove_writer, fd)


def _copy_winsize(src: int, dst: int) -> None:
    with contextlib.suppress(OSError):
        fcntl.ioctl(dst, termios.TIOCSWINSZ, fcntl.ioctl(src, termios.TIOCGWINSZ, b"\0" * 8))


def _selectable(fd: int) -> bool:
    """Whether the loop can wait on `fd` (a terminal, a pipe, a socket); a file or /dev/null is read off it."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return os.isatty(fd) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


async def run_on_pty(argv: list[str], tee: Callable[[bytes], None]) -> int:
    """Run `argv` on a new pty wired to this process's stdin/stdout; every byte it writes also goes to `tee`.
    Returns its exit code."""
    loop = asyncio.get_running_loop()
    master, slave = pty.openpty()
    terminal = os.isatty(0)
    saved = termios.tcgetattr(0) if terminal else None
    blocking = {fd: os.get_blocking(fd) for fd in (0, 1, master)}
    stdin_file = not _selectable(0)
    if terminal:
        _copy_winsize(0, master)
    tasks: list[asyncio.Task[None]] = []
    proc: asyncio.subprocess.Process | None = None
    signals = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=slave, stdout=slave, stderr=slave, start_new_session=True
        )
        os.close(slave)
        slave = -1
        running = proc

        def stop() -> None:
            with contextlib.suppress(ProcessLookupError):
                running.terminate()

        def resized() -> None:
            _copy_winsize(0, master)
            with contextlib.suppress(ProcessLookupError):
                running.send_signal(signal.SIGWINCH)

        for sig in signals:
            loop.add_signal_handler(sig, stop)
        if terminal:
            loop.add_signal_handler(signal.SIGWINCH, resized)
            tty.setraw(0, termios.TCSANOW)
        os.set_blocking(master, False)
        os.set_blocking(1, False)

        async def out() -> None:
            while data := await _read(master):
                tee(data)
                await _write(1, data)

        async def into() -> None:
            if not stdin_file:
                os.set_blocking(0, False)
            while data := (await asyncio.to_thread(os.read, 0, CHUNK) if stdin_file else await _read(0)):
                await _write(master, data)

        outs = asyncio.create_task(out(), name="pty-out")
        tasks = [outs, asyncio.create_task(into(), name="pty-in")]
        code = await proc.wait()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(DRAIN_S):
                await asyncio.shield(outs)
        return code
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        for sig in (*signals, signal.SIGWINCH):
            loop.remove_signal_handler(sig)
        if saved is not None:
            termios.tcsetattr(0, termios.TCSADRAIN, saved)
        for fd, was in blocking.items():
            with contextlib.suppress(OSError):
                os.set_blocking(fd, was)
        os.close(master)
        if slave >= 0:
            os.close(slave)
