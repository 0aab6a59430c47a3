"""Whole files or nothing: the one way bc and the agent replace a file on disk.

`atomic_write` writes a temporary file in the target's directory (its mode set before any byte, so a key is
never readable by others, not even for a moment), fsyncs it, renames it over the target, and fsyncs the
directory, so after a crash or a power cut a reader finds the old file or the new one, never a torn mix and
never an empty file where a rename was not yet durable. Temporary names start with `TMP_PREFIX`, so a
directory scan can tell (and clean up) what a crash left behind mid-write (agent.hw.cdi does).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

TMP_PREFIX = ".bc-tmp-"


def atomic_write(path: Path, data: bytes, mode: int = 0o644, *, dir_mode: int = 0o700) -> None:
    """Replace `path` with `data` (file mode `mode`); a missing parent is made with `dir_mode`.

    Blocking (writes and fsyncs): call it through the agent's offload, or a thread, from async code.
    """
    path = Path(path)
    parent = path.parent
    parent.mkdir(mode=dir_mode, parents=True, exist_ok=True)
    import tempfile  # here: every CLI start imports this module, few write (shutil, bz2, lzma, random: 4 ms)

    fd, tmp = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{path.name}.", suffix=".tmp", dir=parent)  # created 0600
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(parent)


def write_new(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Create `path` with `data` (file mode `mode`), never over an existing file: FileExistsError then.

    For a file handed to a person or kept as the only copy (an exported key, a config with a key inline):
    it is fsynced, and so is its directory, so the file is there after a power cut. Blocking, as `atomic_write`.
    """
    path = Path(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        raise
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    """Make a rename, a new file or a removal in the directory `path` survive a power cut."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
