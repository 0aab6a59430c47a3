"""Boot leases: which machines the boot server answers, until when, with what.

`boot.prepareRamdisk` sets a machine's lease (its MACs, the kernel and initramfs digests, the command
line with the ramdisk's join token) and `boot.cleanUp` removes it. The boot server obeys only a live
lease: a MAC without one gets no DHCP answer and no iPXE script, and an image is served only while a
live lease names it. The leases are the site agent's own state (`data_dir/site/leases.json`), rewritten
whole, so a restart keeps them and a lease ends at its time whether or not anyone cleans up.

`live()` is the pure rule; `LeaseFile` the storage (blocking: through the offload).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class Lease:
    machine: str
    macs: tuple[str, ...]
    kernel_sha256: str
    initrd_sha256: str
    cmdline: str
    expires_at: float
    """Wall time (the agent's clock), seconds."""
    images: tuple[str, ...] = ()
    """More cached images (by digest) served while the lease lives: the OS image the ramdisk deploys."""

    def serves(self, sha256: str) -> bool:
        return sha256 in (self.kernel_sha256, self.initrd_sha256, *self.images)


def live(leases: dict[str, Lease], now: float) -> dict[str, Lease]:
    """The leases whose time has not come, by machine."""
    return {m: lease for m, lease in leases.items() if lease.expires_at > now}


def by_mac(leases: dict[str, Lease], now: float) -> dict[str, Lease]:
    """Each live lease under each of its MACs."""
    return {mac: lease for lease in live(leases, now).values() for mac in lease.macs}


class LeaseFile:
    def __init__(self, site_dir: Path) -> None:
        self.path = site_dir / "leases.json"

    def load(self) -> dict[str, Lease]:
        try:
            doc = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        out: dict[str, Lease] = {}
        for entry in doc.get("leases", []):
            lease = Lease(**{**entry, "macs": tuple(entry["macs"]), "images": tuple(entry.get("images", ()))})
            out[lease.machine] = lease
        return out

    def store(self, leases: dict[str, Lease]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(".leases.json.new")
        with open(tmp, "w") as f:
            json.dump({"leases": [asdict(leases[m]) for m in sorted(leases)]}, f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
