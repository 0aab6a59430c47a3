"""One `bc serve` per data dir (issue 29).

Two servers on one data dir share its `worker-id`, so both would hold every singleton's store lease under
the same name, and the placement pass, the sweeper, liveness and the jobs scheduler would each run twice on
one store. So `bc serve` takes an exclusive `flock` on the data dir itself (the directory, so a server that
is refused creates no file there) for as long as it runs, and writes its pid to `serve.pid` once it is up.
A second one is refused at once, before it opens the store: a `Conflict` (exit 4) naming the running pid.
The kernel drops the lock with the process, so a `kill -9` leaves nothing to clean up.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from bc.errors import Conflict

PID_FILE = "serve.pid"


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
        try:
            text = (self.data_dir / PID_FILE).read_text("utf-8").strip()
        except (OSError, UnicodeDecodeError):
            text = ""
        return f"pid {text}" if text.isdigit() else "pid unknown: it is still starting"

    def started(self) -> None:
        """Name this process in `serve.pid`, once it serves (a start refused later leaves no file)."""
        fd = os.open(self.data_dir / PID_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(f"{os.getpid()}\n")

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            (self.data_dir / PID_FILE).unlink(missing_ok=True)
        os.close(self._fd)  # closing the descriptor drops the flock
        self._fd = None


__all__ = ["PID_FILE", "DataDirLock"]
