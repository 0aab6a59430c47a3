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

import json
from dataclasses import asdict
from pathlib import Path

from agent.instances.runtime import PAUSED, RUNNING, STOPPED, Domain, DomainConfig, RuntimeFailure
from agent.offload import Offload, inline
from bc.runtime.files import atomic_write


class FakeRuntime:
    name = "qemu"

    def __init__(self, path: Path | None = None, offload: Offload = inline) -> None:
        self._path = path
        self._offload = offload
        self._domains: dict[str, Domain] = {}
        self._failures: dict[tuple[str, str], str] = {}
        self.calls: list[tuple[str, str]] = []
        """Every change asked of it, as (step, instance id), for tests."""
        self.user_data: dict[str, tuple[Path, bytes]] = {}
        """The user-data file each instance's last start was handed, and what it held then (memory only: what
        a guest would read; never in the JSON file)."""
        if path is not None and path.exists():
            for d in json.loads(path.read_text()):
                self._domains[d["id"]] = Domain(**d)

    # -- seams for tests ------------------------------------------------
    def add_foreign(self, instance_id: str, state: str = RUNNING, memory_mib: int = 1024) -> None:
        self._domains[instance_id] = Domain(instance_id, state, managed=False, vcpus=1, memory_mib=memory_mib)

    def reboot(self) -> None:
        """The host restarted: every domain is stopped (a test's seam; the next `list` shows it)."""
        for k, d in self._domains.items():
            self._domains[k] = Domain(d.id, STOPPED, d.managed, d.vcpus, d.memory_mib)

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
        self._domains[instance_id] = Domain(d.id, state, d.managed, d.vcpus, d.memory_mib)
        await self._save()

    async def define(self, config: DomainConfig) -> None:
        d = self._check(config.id, "define")
        if d is not None and d.state != STOPPED:
            raise RuntimeFailure(f"domain {config.id} is {d.state.lower()}, not stopped")
        self._domains[config.id] = Domain(config.id, STOPPED, True, config.vcpus, config.memory_mib)
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

    async def _save(self) -> None:
        if self._path is not None:
            doc = [asdict(d) for d in sorted(self._domains.values(), key=lambda d: d.id)]
            await self._offload(atomic_write, self._path, json.dumps(doc).encode(), mode=0o600)
