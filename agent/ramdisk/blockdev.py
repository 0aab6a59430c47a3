"""Raw I/O on a whole disk: open it exclusively, discard it, overwrite it, check it reads zero.

All blocking: every function here runs through the agent's offload, in pieces small enough
(`PIECE`) that a cancel lands between two of them.

A block device is opened `O_EXCL`, which the kernel refuses (EBUSY) while anything has it mounted or
holds it (device-mapper, md, swap): a second guard behind `machine.in_use`, and the one that also
catches a mount made after the inventory was read. Where loop devices are not available the tests
hand a plain file instead; the ioctls then fail with ENOTTY and the wipe falls back to an overwrite,
as it does on a disk that does not discard.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

BLKGETSIZE64 = 0x80081272
BLKDISCARD = 0x1277
BLKSECDISCARD = 0x127D
BLKFLSBUF = 0x1261
BLOCK = 4 << 20
PIECE = 256 << 20
"""How much one offloaded call writes or reads: between two, a cancelled command stops."""
SAMPLE = 1 << 20
SAMPLES = 16
_UNSUPPORTED = (errno.EOPNOTSUPP, errno.ENOTTY, errno.EINVAL, errno.ENOTSUP)


@dataclass(frozen=True)
class OpenDisk:
    fd: int
    size: int
    is_block: bool


class DiskBusy(Exception):
    """The kernel refused the exclusive open: something has the disk mounted or holds it."""


def open_disk(path: Path) -> OpenDisk:
    """Open the disk read-write: exclusively when it is a block device. DiskBusy on EBUSY."""
    st = os.stat(path)
    is_block = stat.S_ISBLK(st.st_mode)
    flags = os.O_RDWR | os.O_CLOEXEC | (os.O_EXCL if is_block else 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.EBUSY:
            raise DiskBusy(f"{path} is busy: the kernel refused an exclusive open (mounted or held)") from None
        raise
    if is_block:
        buf = fcntl.ioctl(fd, BLKGETSIZE64, b"\0" * 8)
        size = int(struct.unpack("Q", buf)[0])
    else:
        size = st.st_size
    return OpenDisk(fd, size, is_block)


def close(disk: OpenDisk) -> None:
    os.close(disk.fd)


def discard(disk: OpenDisk, *, secure: bool) -> bool:
    """BLKSECDISCARD (`secure`) or BLKDISCARD over the whole disk; False when the device does not support it."""
    if not disk.is_block:
        return False
    try:
        fcntl.ioctl(disk.fd, BLKSECDISCARD if secure else BLKDISCARD, struct.pack("QQ", 0, disk.size))
    except OSError as e:
        if e.errno in _UNSUPPORTED:
            return False
        raise
    return True


def sample_offsets(size: int, samples: int = SAMPLES) -> list[int]:
    """Where `reads_zero` looks: the first and last MiB and evenly between (fewer on a small disk)."""
    last = max(size - SAMPLE, 0)
    if samples <= 1 or last == 0:
        return [0]
    return sorted({last * i // (samples - 1) // 4096 * 4096 for i in range(samples)} | {last})


def reads_zero(disk: OpenDisk) -> bool:
    """True when every sample reads back as zeros (after the kernel dropped its cached pages)."""
    drop_cache(disk)
    for off in sample_offsets(disk.size):
        data = os.pread(disk.fd, min(SAMPLE, disk.size - off), off)
        if data.count(0) != len(data):
            return False
    return True


def overwrite(disk: OpenDisk, start: int, end: int) -> int:
    """Zeros from `start` up to `end` (at most one PIECE per call is the caller's business); bytes written."""
    zeros = bytes(BLOCK)
    off = start
    while off < end:
        n = min(BLOCK, end - off)
        written = os.pwrite(disk.fd, zeros[:n] if n < BLOCK else zeros, off)
        off += written
    return off - start


def write_at(disk: OpenDisk, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(disk.fd, view, offset)
        view, offset = view[n:], offset + n


def read_at(disk: OpenDisk, offset: int, length: int) -> bytes:
    return os.pread(disk.fd, length, offset)


def sync(disk: OpenDisk) -> None:
    os.fsync(disk.fd)


def drop_cache(disk: OpenDisk) -> None:
    """Write back and drop the kernel's cached pages, so the next read comes from the device itself."""
    os.fsync(disk.fd)
    if disk.is_block:
        try:
            fcntl.ioctl(disk.fd, BLKFLSBUF, 0)
        except OSError:
            pass
    os.posix_fadvise(disk.fd, 0, 0, os.POSIX_FADV_DONTNEED)


def invalidate(disk: OpenDisk) -> None:
    """Zero the first and last MiB (MBR, GPT and its backup, most filesystems' superblocks): a half-written
    image must never boot, nor be taken for the image it was meant to be."""
    head = min(SAMPLE, disk.size)
    overwrite(disk, 0, head)
    overwrite(disk, max(disk.size - SAMPLE, head), disk.size)
    os.fsync(disk.fd)
