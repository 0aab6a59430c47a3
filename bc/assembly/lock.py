"""One `bc serve` per data dir (issue 29).

Two servers on one data dir share its `worker-id`, so both would hold every singleton's store lease under
the same name, and the placement pass, the sweeper, liveness and the jobs scheduler would each run twice on
one store. So `bc serve` takes an exclusive `flock` on the data dir itself (the directory: nothing is
written into it, so a data dir lists the same files as before) for as long as it runs. A second one is
refused at once, before it opens the store: a `Conflict` (exit 4) naming the running pid, which the kernel
keeps with the lock (`/proc/locks`). The kernel drops the lock with the process, so a `kill -9` leaves
nothing to clean up.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from bc.errors import Conflict


def holder_of(line: str, major: int, minor: int, inode: int) -> int | None:
    """The pid in one `/proc/locks` line when it is a FLOCK on that device and inode, else None.

    `1: FLOCK  ADVISORY  WRITE 4242 fd:01:1234567 0 EOF` (the device in hex, `major:minor:inode`)."""
    fields = line.split()
    if len(fields) < 6 or "FLOCK" not in fields:
        return None
    i = fields.index("FLOCK")
    if len(fields) < i + 5 or not fields[i + 3].isdigit():
        return None
    parts = fields[i + 4].split(":")
    try:
        if len(parts) != 3 or (int(parts[0], 16), int(parts[1], 16), int(parts[2])) != (major, minor, inode):
            return None
    except ValueError:
        return None
    return int(fields[i + 3])


class DataDirLock:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self._fd: int | None = None

    def acquire(self) -> None:
        """Hold the data dir, or raise Conflict naming the bc serve that holds it."""
        fd = os.open(self.data_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise Conflict(
                f"another bc serve ({self._holder()}) is running on the data dir {self.data_dir}; "
                "stop it first, or give this one its own --data-dir"
            ) from None
        self._fd = fd

    def _holder(self) -> str:
        """`pid N` of the process holding the data dir's flock, read from `/proc/locks` by the dir's inode."""
        try:
            st = os.stat(self.data_dir)
            with open("/proc/locks", encoding="ascii", errors="replace") as f:
                lines = f.read().splitlines()
        except OSError:
            return "pid unknown"
        for line in lines:
            pid = holder_of(line, os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
            if pid is not None:
                return f"pid {pid}"
        return "pid unknown"

    def release(self) -> None:
        if self._fd is None:
            return
        os.close(self._fd)  # closing the descriptor drops the flock
        self._fd = None


__all__ = ["DataDirLock", "holder_of"]
