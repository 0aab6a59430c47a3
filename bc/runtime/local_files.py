"""Local files the CLI reads, bounded (issue 29): `@file` payloads, operator configs, keys, certificates.

A path an operator types may name anything: a FIFO (`open` waits for a writer forever), `/dev/zero` (a read
never ends), a directory, or a 3 GB file (a sparse one costs nothing to make, and reading it whole takes the
CLI's memory with it). So each is opened without blocking (`O_NONBLOCK`: a FIFO opens at once), checked to
be a regular file no bigger than `max_local_file` (`bc.protocol.limits`) by `fstat` on the open descriptor
(so the check and the read see the same file), and read to at most the limit plus one byte, in case it
grows meanwhile. Any refusal is one sentence naming the file, a UsageError (exit 2), before any byte is read.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from bc.errors import UsageError
from bc.protocol.limits import LIMITS, Limits

_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISSOCK, "a socket"),
)


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def read_local_file(path: Path | str, what: str, limits: Limits = LIMITS) -> bytes:
    """The bytes of `path`, a regular file of at most `max_local_file` bytes; a UsageError naming `what` else."""
    limit = limits.max_local_file
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        raise UsageError(f"cannot read {what} {path}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{what} {path} is {_kind(st.st_mode)}, not a regular file")
        if st.st_size > limit:
            raise UsageError(f"{what} {path} is {st.st_size:,} bytes; the limit is {limit:,} bytes (max_local_file)")
        chunks: list[bytes] = []
        got = 0
        while got <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got > limit:
            raise UsageError(f"{what} {path} grew past {limit:,} bytes while being read (max_local_file)")
        return b"".join(chunks)
    except OSError as e:
        raise UsageError(f"cannot read {what} {path}: {e.strerror or e}") from None
    finally:
        os.close(fd)


def read_local_text(path: Path | str, what: str, limits: Limits = LIMITS) -> str:
    """`read_local_file` decoded as UTF-8; a file that is not UTF-8 is a UsageError naming the byte."""
    raw = read_local_file(path, what, limits)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{what} {path} is not UTF-8 (byte {e.start} is {raw[e.start]:#04x})") from None


__all__ = ["read_local_file", "read_local_text"]
