"""The runtime seam: what the `instances` converger asks of a hypervisor, and nothing more.

A runtime lists the domains it knows, bc's (`managed`, with bc's record) and
anyone else's (reported, never touched), and changes bc's own: define (write
or rewrite the record of a stopped domain), start (paused or not), pause,
resume, stop, delete. A start may hand the guest a user-data file. Each call either does what it says or raises
`RuntimeFailure` with one sentence, which fails that instance only. A start
the hypervisor refuses for lack of memory says so with `capacity=True`.

Implementations: `agent.instances.fake.FakeRuntime` (`--fake-hw`, unit tests)
and `agent.instances.qemu.QemuRuntime` (qemu over QMP).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

# What a runtime observes of a domain (the converger's plan adds ABSENT for one it does not list).
RUNNING: Final = "RUNNING"
PAUSED: Final = "PAUSED"
STOPPED: Final = "STOPPED"
OBSERVED_STATES: tuple[str, ...] = (RUNNING, PAUSED, STOPPED)


@dataclass(frozen=True)
class Domain:
    """One domain a runtime knows. `managed`: bc created it (its record is bc's); else it is only reported."""

    id: str
    state: str
    managed: bool
    vcpus: int = 0
    memory_mib: int = 0


@dataclass(frozen=True)
class DomainConfig:
    """What bc defines a domain with: the spec's instance, its boot files resolved on this host."""

    id: str
    vcpus: int
    memory_mib: int
    kernel: Path
    initrd: Path | None
    cmdline: str
    allocation_id: str = ""


class RuntimeFailure(Exception):
    """A runtime call that did not do what it says: one sentence for the instance's ERROR message."""

    def __init__(self, message: str, *, capacity: bool = False) -> None:
        super().__init__(message)
        self.capacity = capacity


class InstanceRuntime(Protocol):
    name: str

    async def list(self) -> list[Domain]: ...

    async def define(self, config: DomainConfig) -> None: ...

    async def start(self, instance_id: str, *, paused: bool, user_data: Path | None = None) -> None:
        """Start the domain; `user_data`: a file whose content the guest is handed (qemu: fw_cfg
        `opt/bc/user-data`), read at start only."""
        ...

    async def pause(self, instance_id: str) -> None: ...

    async def resume(self, instance_id: str) -> None: ...

    async def stop(self, instance_id: str) -> None: ...

    async def delete(self, instance_id: str) -> None: ...
