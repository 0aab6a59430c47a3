"""GPUs booked for an instance (`BINDING_INSTANCE`): the devices converger's record instead of a CDI spec.

An instance assignment books whole GPUs for the VM of its allocation, in the
same ledger as holds (the control plane's booking, and the devices
converger's overlap check on this node), so a GPU is never both held and
passed through. No container runtime may see such a GPU, so the converger
writes no CDI spec for it: it records the booking as
`<dir>/bc-<allocation>.json` (`{"bc": 1, "allocation_id", "reservation_id",
"gpus": [uuid...]}`), and the `instances` converger passes through only GPUs
recorded here for the instance's allocation (agent.instances.passthrough).

The records are read back as `cdi.HeldSpec`s with `instance=True`, so the
devices plan treats them as holds for every rule (overlap, release,
adoption after a journal loss) and only the files differ.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agent.hw import cdi
from agent.offload import Offload
from bc.protocol.atoms import GPU, parse_atom

log = logging.getLogger(__name__)

PREFIX = "bc-"
SUFFIX = ".json"


def record(allocation_id: str, reservation_id: str, gpus: Sequence[str]) -> dict[str, Any]:
    return {"bc": 1, "allocation_id": allocation_id, "reservation_id": reservation_id, "gpus": list(gpus)}


def record_bytes(doc: Mapping[str, Any]) -> bytes:
    return (json.dumps(doc, sort_keys=True, indent=2) + "\n").encode()


class InstanceBookings:
    """The booking records in one directory (blocking methods run through `offload`)."""

    def __init__(self, directory: Path, offload: Offload) -> None:
        self.directory = directory
        self.offload = offload

    def path(self, allocation_id: str) -> Path:
        return self.directory / f"{PREFIX}{allocation_id}{SUFFIX}"

    def read(self) -> dict[str, cdi.HeldSpec]:
        """Every record, by allocation id, as a hold (blocking). A file that is not one is skipped."""
        out: dict[str, cdi.HeldSpec] = {}
        for path in cdi.entries(self.directory, PREFIX, SUFFIX):
            try:
                held = _parse(path)
            except (OSError, ValueError, KeyError, TypeError) as e:
                log.warning("event=instance-booking.unreadable path=%s error=%r", path, str(e))
                continue
            out[held.allocation_id] = held
        return out

    async def booked(self) -> dict[str, frozenset[str]]:
        """The GPUs booked for each allocation, read fresh (the instances converger's check)."""
        held = await self.offload(self.read)
        return {aid: frozenset(a.gpu_uuid for a in h.atoms) for aid, h in held.items()}

    async def write(self, allocation_id: str, doc: Mapping[str, Any]) -> None:
        await self.offload(_write, self.directory, self.path(allocation_id), record_bytes(doc))

    async def remove(self, allocation_id: str) -> bool:
        return await self.offload(cdi.remove_file, self.path(allocation_id))


def _write(directory: Path, path: Path, data: bytes) -> None:
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    cdi.atomic_write(path, data)


def _parse(path: Path) -> cdi.HeldSpec:
    doc = json.loads(path.read_text("utf-8"))
    if not isinstance(doc, dict) or doc.get("bc") != 1:
        raise ValueError("not a bc instance booking")
    allocation_id = str(doc["allocation_id"])
    if path.name != f"{PREFIX}{allocation_id}{SUFFIX}":
        raise ValueError(f"the file names another allocation than {allocation_id!r}")
    gpus = doc["gpus"]
    if not isinstance(gpus, list):
        raise TypeError("gpus is not a list")
    return cdi.HeldSpec(
        allocation_id=allocation_id,
        reservation_id=str(doc.get("reservation_id", "")),
        kubernetes=False,
        atoms=tuple(parse_atom(GPU, str(g)) for g in gpus),
        doc=doc,
        path=path,
        instance=True,
    )
