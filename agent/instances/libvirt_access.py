"""Letting libvirt's qemu reach a domain's files: search (never read) on the directories above them.

On a stock `qemu:///system` libvirt runs qemu as its own user (`libvirt-qemu`)
with dynamic ownership: it relabels each file a domain names (kernel, initrd,
disks, fw_cfg files) to that user, but never the directories on their way,
while bc's data directory and the user-data directory are 0700 root. So
before a domain is defined or started, bc adds `o+x` (search, not listing)
to each directory from the data directory down to every file the domain
names, and to the user-data file's own directory (the reference's "QEMU
reaches its files"). Listing stays closed, and bc's own files there keep
their modes (0600 identity, keys, journal): a directory's x bit lets a user
open a name it already knows, nothing more.

`search_dirs` is pure; `grant_search` the blocking chmods (through the
runtime's Offload).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from agent.instances.runtime import DomainConfig


def domain_files(config: DomainConfig) -> list[Path]:
    """Every host file the domain names that qemu opens itself (the overlay's base image through its backing
    chain)."""
    files = [p for p in (config.kernel, config.initrd, config.disk, config.disk_base) if p is not None]
    return files + [v.path for v in config.volumes]


def search_dirs(top: Path, files: Iterable[Path], user_data: Path | None = None) -> list[Path]:
    """The directories qemu must search: from `top` down to each file's directory, for files under `top`
    (a file elsewhere gets nothing: bc does not open up directories it does not own), and the user-data
    file's own directory. Ascending, each once."""
    out: set[Path] = set()
    for f in files:
        try:
            rel = f.parent.relative_to(top)
        except ValueError:
            continue
        d = top
        out.add(d)
        for part in rel.parts:
            d = d / part
            out.add(d)
    if user_data is not None:
        out.add(user_data.parent)
    return sorted(out)


def grant_search(dirs: Iterable[Path]) -> None:
    """Blocking: add o+x to each directory that lacks it (never through a symlink: a name that is not a real
    directory is left as it is, and qemu then fails to open what is under it)."""
    for d in dirs:
        st = os.lstat(d)
        if stat.S_ISDIR(st.st_mode) and not st.st_mode & stat.S_IXOTH:
            os.chmod(d, stat.S_IMODE(st.st_mode) | stat.S_IXOTH)
