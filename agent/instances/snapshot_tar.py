"""The snapshot tar on disk: written for an upload, read back for a restore. Blocking: run through the Offload.

`build` streams `meta.json`, the flattened disk and the memory state into one
tar, hashing as it writes (the digest the command reports is of the bytes
uploaded). `unpack` reads a downloaded tar member by member, never with
`extractall`: only the names of `agent.instances.snapshot_meta`, regular files,
each written by name into the instance's directory (0600), so no member can
name a path, a link or a device. `check_flat_qcow2` reads the restored disk's
header without any tool (a tenant's disk is untrusted input, and `qemu-img`
may follow what an image names): a qcow2 of version 2 or 3 that names no
backing file and no external data file, and is not encrypted.
"""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

from agent.hashing import HashingSink
from agent.instances import qcow2
from agent.instances.snapshot_meta import (
    DISK,
    MAX_META_BYTES,
    MEMORY,
    META,
    SnapshotError,
    SnapshotMeta,
    check_member,
    check_members,
    parse_meta,
)

BLOCK = 1 << 20


def build(dest: Path, meta: SnapshotMeta, disk: Path | None, memory: Path | None) -> tuple[str, int]:
    """Write the snapshot tar to `dest` (0600); its (sha256, size). `dest` is removed when this fails."""
    try:
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            sink = HashingSink(f)
            with tarfile.open(fileobj=sink, mode="w", format=tarfile.PAX_FORMAT) as tar:
                raw = meta.encode()
                info = tarfile.TarInfo(META)
                info.size, info.mode = len(raw), 0o600
                tar.addfile(info, io.BytesIO(raw))
                for name, path in ((DISK, disk), (MEMORY, memory)):
                    if path is None:
                        continue
                    info = tarfile.TarInfo(name)
                    info.size, info.mode = path.stat().st_size, 0o600
                    with path.open("rb") as src:
                        tar.addfile(info, src)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        dest.unlink(missing_ok=True)
        raise
    return sink.sha256.hexdigest(), sink.size


def unpack(src: Path, into: Path, check: Callable[[SnapshotMeta], None]) -> SnapshotMeta:
    """Read the tar at `src`, check its meta.json with `check` (SnapshotError), and write its disk and memory
    state into `into` (which must exist). SnapshotError for anything that is not a snapshot of ours."""
    seen: set[str] = set()
    meta: SnapshotMeta | None = None
    try:
        with tarfile.open(src, mode="r:") as tar:
            for member in tar:
                check_member(member.name, member.isreg(), seen)
                f = tar.extractfile(member)
                assert f is not None  # a regular file
                if member.name == META:
                    meta = parse_meta(f.read(MAX_META_BYTES + 1))
                    check(meta)
                    continue
                _copy(f, into / member.name)
    except tarfile.TarError as e:
        raise SnapshotError(f"the snapshot is not a tar: {e}") from None
    if meta is None:
        raise SnapshotError(f"the snapshot has no {META}")
    check_members(meta, seen)
    if meta.disk:
        check_flat_qcow2(into / DISK)
    return meta


def _copy(f: IO[bytes], dest: Path) -> None:
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as out:
        while chunk := f.read(BLOCK):
            out.write(chunk)
        out.flush()
        os.fsync(out.fileno())


def check_flat_qcow2(path: Path) -> None:
    """The restored disk's header (agent.instances.qcow2, which opens nothing an image names): SnapshotError
    unless a flat, unencrypted qcow2 naming no other file (a snapshot's disk is flattened)."""
    try:
        qcow2.check_base(*qcow2.read_head(path))
    except qcow2.Qcow2Refused as e:
        raise SnapshotError(f"the snapshot's {DISK} {e}") from None
