"""The fake runtime: domains as records in memory (and in one JSON file under `--fake-hw`).

The `instances` converger drives it exactly as it drives qemu. It keeps what a
hypervisor would (state, vCPUs, memory, whether bc created it), and its seams
let a test show the rest of the world: `add_foreign` a domain bc did not
create, `reboot` the host (every domain stops), `fail` a step of one instance
with a message; `user_data` shows what the last start handed each guest.
It does no capacity check of its own: host admission
(agent.instances.admission) is the converger's.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, replace
from pathlib import Path

from agent.instances.runtime import (
    PAUSED,
    RUNNING,
    STOPPED,
    BalloonReading,
    Domain,
    DomainConfig,
    NoBalloon,
    RuntimeFailure,
    VolumeConfig,
)
from agent.offload import Offload, inline
from bc.runtime.files import atomic_write


class FakeRuntime:
    name = "qemu"

    def __init__(self, path: Path | None = None, offload: Offload = inline) -> None:
        self._path = path
        self._offload = offload
        self._domains: dict[str, Domain] = {}
        self._failures: dict[tuple[str, str], str] = {}
        self.resized: dict[tuple[str, str], int] = {}
        """The live resizes of volumes, (instance, volume) -> size."""
        self.calls: list[tuple[str, str]] = []
        """Every change asked of it, as (step, instance id), for tests."""
        self.user_data: dict[str, tuple[Path, bytes]] = {}
        """The user-data file each instance's last start was handed, and what it held then (memory only: what
        a guest would read; never in the JSON file)."""
        self.configs: dict[str, DomainConfig] = {}
        """What each domain was last defined with (memory only), e.g. the GPU addresses qemu would get."""
        self.balloons: dict[str, int] = {}
        """What each balloon leaves its guest (a domain defined with a balloon has an entry)."""
        self.guest_used: dict[str, int] = {}
        """What a guest says it uses, set by tests (absent: it has not said)."""
        if path is not None and path.exists():
            for d in json.loads(path.read_text()):
                self._domains[d["id"]] = Domain(**{**d, "volumes": tuple(d.get("volumes", ()))})

    # -- seams for tests ------------------------------------------------
    def add_foreign(self, instance_id: str, state: str = RUNNING, memory_mib: int = 1024) -> None:
        self._domains[instance_id] = Domain(instance_id, state, managed=False, vcpus=1, memory_mib=memory_mib)

    def reboot(self) -> None:
        """The host restarted: every domain is stopped (a test's seam; the next `list` shows it)."""
        for k, d in self._domains.items():
            self._domains[k] = replace(d, state=STOPPED)

    def fail(self, instance_id: str, step: str, message: str) -> None:
        """The next `step` (define, start, pause, resume, stop, delete) of this instance raises `message`."""
        self._failures[(instance_id, step)] = message

    def domain(self, instance_id: str) -> Domain | None:
        return self._domains.get(instance_id)

    # -- the runtime ----------------------------------------------------
    async def list(self) -> list[Domain]:
        return sorted(self._domains.values(), key=lambda d: d.id)

    def _check(self, instance_id: str, step: str) -> Domain | None:
        self.calls.append((step, instance_id))
        message = self._failures.pop((instance_id, step), None)
        if message is not None:
            raise RuntimeFailure(message)
        d = self._domains.get(instance_id)
        if d is not None and not d.managed:
            raise RuntimeFailure(f"domain {instance_id} is not bc's")
        return d

    async def _set(self, instance_id: str, state: str) -> None:
        d = self._domains.get(instance_id)
        if d is None:
            raise RuntimeFailure(f"no domain {instance_id}")
        self._domains[instance_id] = replace(d, state=state)
        await self._save()

    async def define(self, config: DomainConfig) -> None:
        d = self._check(config.id, "define")
        if d is not None and d.state != STOPPED:
            raise RuntimeFailure(f"domain {config.id} is {d.state.lower()}, not stopped")
        self.configs[config.id] = config
        self._domains[config.id] = Domain(
            config.id,
            STOPPED,
            True,
            config.vcpus,
            config.memory_mib,
            config.placement.hugepage_mib,
            volumes=tuple(v.id for v in config.volumes),
        )
        if config.placement.balloon:
            self.balloons[config.id] = config.memory_mib
        else:
            self.balloons.pop(config.id, None)
        await self._save()

    async def start(self, instance_id: str, *, paused: bool, user_data: Path | None = None) -> None:
        self._check(instance_id, "start")
        if user_data is not None:
            self.user_data[instance_id] = (user_data, await self._offload(user_data.read_bytes))
        else:
            self.user_data.pop(instance_id, None)
        await self._set(instance_id, PAUSED if paused else RUNNING)

    async def pause(self, instance_id: str) -> None:
        self._check(instance_id, "pause")
        await self._set(instance_id, PAUSED)

    async def resume(self, instance_id: str) -> None:
        self._check(instance_id, "resume")
        await self._set(instance_id, RUNNING)

    async def stop(self, instance_id: str) -> None:
        self._check(instance_id, "stop")
        await self._set(instance_id, STOPPED)

    async def delete(self, instance_id: str) -> None:
        self._check(instance_id, "delete")
        self._domains.pop(instance_id, None)
        await self._save()

    async def attach_volume(self, instance_id: str, volume: VolumeConfig) -> None:
        d = self._check(instance_id, "attach")
        if d is None or d.state == STOPPED:
            raise RuntimeFailure(f"domain {instance_id} is not running")
        vols = (*[v for v in d.volumes if v != volume.id], volume.id)
        self._domains[instance_id] = dataclasses.replace(d, volumes=vols)
        await self._save()

    async def resize_volume(self, instance_id: str, volume_id: str, size_bytes: int) -> None:
        d = self._check(instance_id, "resize")
        if d is None or d.state == STOPPED or volume_id not in d.volumes:
            raise RuntimeFailure(f"domain {instance_id} has no volume {volume_id} open")
        self.resized[(instance_id, volume_id)] = size_bytes

    async def detach_volume(self, instance_id: str, volume_id: str) -> None:
        d = self._check(instance_id, "detach")
        if d is None or d.state == STOPPED:
            raise RuntimeFailure(f"domain {instance_id} is not running")
        self._domains[instance_id] = dataclasses.replace(d, volumes=tuple(v for v in d.volumes if v != volume_id))
        await self._save()

    async def balloon(self, instance_id: str) -> BalloonReading:
        d = self._domains.get(instance_id)
        if d is None or d.state != RUNNING:
            raise RuntimeFailure(f"domain {instance_id} is not running")
        if instance_id not in self.balloons:
            raise NoBalloon(f"domain {instance_id} has no balloon device")
        return BalloonReading(self.balloons[instance_id], self.guest_used.get(instance_id))

    async def set_balloon(self, instance_id: str, actual_mib: int) -> None:
        self.calls.append(("balloon", instance_id))
        await self.balloon(instance_id)
        self.balloons[instance_id] = actual_mib

    async def _save(self) -> None:
        if self._path is not None:
            doc = [asdict(d) for d in sorted(self._domains.values(), key=lambda d: d.id)]
            await self._offload(atomic_write, self._path, json.dumps(doc).encode(), mode=0o600)
