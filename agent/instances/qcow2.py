"""A qcow2 header and its header extensions read in pure Python: what a tenant image may not say.

A tenant's image is untrusted input to the hypervisor. A qcow2 may name a backing file (the host's disk,
another instance's) or an external data file, which qemu would open; and `qemu-img info` itself may follow
what an image names. So no tool inspects a tenant image: this module reads the header (the spec's
`docs/interop/qcow2.txt`) from bytes the caller read from the start of the file, and opens nothing.

A base image is refused (`Qcow2Refused`, one sentence) when it is not a qcow2 v2 or v3, its header is
truncated or malformed, it names a backing file (or a backing format), an external data file (incompatible
bit 2 or the data-file extension), sets an incompatible bit this module does not know, is marked corrupt,
or is encrypted (`crypt_method`, or the full-disk-encryption extension). An instance's overlay
(`disk.qcow2`) passes the same checks but must name exactly its recorded base and format
(`check_overlay`): a VMM that once ran it could have rewritten its header.

`raw` images are never probed: qemu opens them with their format stated, so their content is only data.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Final

MAGIC: Final = b"QFI\xfb"
V2_HEADER: Final = 72
V3_MIN_HEADER: Final = 104
READ_BYTES: Final = 2 << 20  # the largest cluster (cluster_bits 21): header and extensions lie in the first

EXT_END: Final = 0
EXT_BACKING_FORMAT: Final = 0xE2792ACA
EXT_FEATURE_NAMES: Final = 0x6803F857
EXT_BITMAPS: Final = 0x23852875
EXT_ENCRYPTION: Final = 0x0537BE77
EXT_DATA_FILE: Final = 0x44415441

INCOMPAT_DIRTY: Final = 1 << 0
INCOMPAT_CORRUPT: Final = 1 << 1
INCOMPAT_DATA_FILE: Final = 1 << 2
INCOMPAT_COMPRESSION: Final = 1 << 3
INCOMPAT_EXTENDED_L2: Final = 1 << 4
KNOWN_INCOMPAT: Final = (
    INCOMPAT_DIRTY | INCOMPAT_CORRUPT | INCOMPAT_DATA_FILE | INCOMPAT_COMPRESSION | INCOMPAT_EXTENDED_L2
)


class Qcow2Refused(Exception):
    """The image may not be used; the message is one clause ("names a backing file …")."""


@dataclass(frozen=True)
class Header:
    version: int
    size: int
    """The virtual disk's size in bytes."""
    cluster_bits: int
    crypt_method: int
    incompatible: int
    backing_file: str | None
    backing_format: str | None
    data_file: bool
    encryption_ext: bool


def parse(data: bytes, file_size: int) -> Header:
    """The header in `data` (the file's first bytes, up to READ_BYTES, of a file of `file_size` bytes);
    Qcow2Refused when it is not one."""
    if len(data) < 4 or data[:4] != MAGIC:
        raise Qcow2Refused("is not a qcow2 image")
    if len(data) < V2_HEADER:
        raise Qcow2Refused("has a truncated qcow2 header")
    (version, backing_off, backing_len, cluster_bits, size, crypt) = struct.unpack_from(">IQIIQI", data, 4)
    if version not in (2, 3):
        raise Qcow2Refused(f"is a qcow2 of version {version}, not 2 or 3")
    if not 9 <= cluster_bits <= 21:
        raise Qcow2Refused(f"has a malformed qcow2 header (cluster_bits {cluster_bits})")
    cluster = 1 << cluster_bits
    l1_size, l1_off, refcount_off, refcount_clusters = struct.unpack_from(">IQQI", data, 36)
    if l1_off + 8 * l1_size > file_size or refcount_off + refcount_clusters * cluster > file_size:
        raise Qcow2Refused("is truncated: its tables lie past the end of the file")
    incompatible, header_len = 0, V2_HEADER
    if version == 3:
        if len(data) < V3_MIN_HEADER:
            raise Qcow2Refused("has a truncated qcow2 header")
        incompatible = struct.unpack_from(">Q", data, 72)[0]
        header_len = struct.unpack_from(">I", data, 100)[0]
        if header_len < V3_MIN_HEADER or header_len % 8 or header_len > cluster:
            raise Qcow2Refused(f"has a malformed qcow2 header (header_length {header_len})")
    backing: str | None = None
    if backing_off or backing_len:
        end = backing_off + backing_len
        if backing_len > 1023 or end > cluster or end > len(data) or backing_off < header_len:
            raise Qcow2Refused("names a backing file outside its header")
        backing = data[backing_off:end].decode("utf-8", "replace")
    backing_format, data_file, encryption_ext = None, False, False
    off, limit = header_len, min(cluster, len(data))
    while True:  # the extensions: (type, length, data padded to 8) until the end marker
        if off + 8 > limit:
            if len(data) < cluster and off + 8 > len(data):
                raise Qcow2Refused("has a truncated qcow2 header")
            raise Qcow2Refused("has malformed qcow2 header extensions")
        kind, length = struct.unpack_from(">II", data, off)
        off += 8
        if kind == EXT_END:
            break
        if off + length > limit:
            raise Qcow2Refused(
                "has a truncated qcow2 header" if off + length > len(data) else "has malformed qcow2 header extensions"
            )
        body = data[off : off + length]
        if kind == EXT_BACKING_FORMAT:
            backing_format = body.decode("utf-8", "replace")
        elif kind == EXT_DATA_FILE:
            data_file = True
        elif kind == EXT_ENCRYPTION:
            encryption_ext = True
        off += (length + 7) & ~7
    return Header(version, size, cluster_bits, crypt, incompatible, backing, backing_format, data_file, encryption_ext)


def _common(h: Header) -> None:
    if h.data_file or h.incompatible & INCOMPAT_DATA_FILE:
        raise Qcow2Refused("names an external data file")
    unknown = h.incompatible & ~KNOWN_INCOMPAT
    if unknown:
        raise Qcow2Refused(f"sets incompatible qcow2 feature bits bc does not know ({unknown:#x})")
    if h.incompatible & INCOMPAT_CORRUPT:
        raise Qcow2Refused("is marked corrupt")
    if h.crypt_method or h.encryption_ext:
        raise Qcow2Refused("is encrypted")


def check_base(data: bytes, file_size: int) -> Header:
    """A tenant's base image: a plain qcow2 naming nothing else. Its header, or Qcow2Refused."""
    h = parse(data, file_size)
    if h.backing_file is not None or h.backing_format is not None:
        raise Qcow2Refused("names a backing file")
    _common(h)
    return h


def check_overlay(data: bytes, file_size: int, base: Path, base_format: str) -> Header:
    """An instance's own disk: the same checks, naming exactly `base` in `base_format` as its backing file."""
    h = parse(data, file_size)
    _common(h)
    if h.backing_file != str(base) or h.backing_format != base_format:
        raise Qcow2Refused(
            f"names the backing file {h.backing_file!r} ({h.backing_format}), not its base image {str(base)!r}"
            f" ({base_format})"
        )
    return h


def read_head(path: Path) -> tuple[bytes, int]:
    """Blocking: the file's first READ_BYTES (all of a smaller file) and its size, opened without following a
    symlink."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        return f.read(READ_BYTES), os.fstat(f.fileno()).st_size
