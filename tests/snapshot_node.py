"""A node's instances section with snapshots and the identity rebind, over any runtime: what the snapshot
tests drive, over the fake runtime (tests/integration/test_instances_snapshots.py) and over a real guest
(tests/integration/test_instances_qemu_snapshots.py). The object store they upload to is
tests/snapshot_https.py.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from pathlib import Path

from google.protobuf import any_pb2

from agent.converge.instance_rebind import Rebinder
from agent.converge.instances import InstancesConverger
from agent.converge.run import SectionResult
from agent.hw.fake import FakeHardware
from agent.instances.admission import HostMemory
from agent.instances.runtime import InstanceRuntime
from agent.instances.snapshots import RETRY_S, SnapshotRuntime, Snapshots
from agent.instances.transfer import Limits
from agent.kinds import REGISTRY, KindContext, KindResult
from agent.offload import to_thread
from bc.protocol.pb import common_pb2, kinds_pb2, spec_pb2
from bc.seams.clock import SystemClock
from tests.instance_parts import SecretPort


class SnapshotNode:
    """The converger, `Snapshots` and the `Rebinder` over `runtime` and its snapshot `adapter`, and the
    `instance.snapshot` command's context; every download and rebind that ends sets `woken`."""

    woke_within_s = 20.0

    def __init__(
        self,
        data: Path,
        boot: Path,
        runtime: InstanceRuntime,
        adapter: SnapshotRuntime,
        memory: Callable[[], Awaitable[HostMemory | None]],
        *,
        ca_pem: bytes,
        limits: Limits,
        cdi_dir: Path,
        answer_s: float,
        poll_s: float,
        retry_s: float = RETRY_S,
        rebind_retry_s: float = 300.0,  # the Rebinder's own default
    ) -> None:
        self.data = data
        self.runtime = runtime
        self.adapter = adapter
        self.woken = asyncio.Event()
        self.port = SecretPort()
        self.snapshots = Snapshots(
            data / "snapshots",
            adapter,
            to_thread,
            SystemClock(),
            rng=random.Random(1),
            ca_pem=ca_pem,
            limits=limits,
            retry_s=retry_s,
            wake=self.woken.set,
        )
        self.rebinder = Rebinder(
            data / "instances-rebound.json",
            adapter,
            self.port,
            to_thread,
            SystemClock(),
            rng=random.Random(2),
            answer_s=answer_s,
            poll_s=poll_s,
            retry_s=rebind_retry_s,
            wake=self.woken.set,
        )
        self.conv = InstancesConverger(
            {"qemu": runtime},
            boot,
            memory,
            list,
            to_thread,
            self.port,
            snapshots=self.snapshots,
            rebinder=self.rebinder,
        )
        self.spec: list[spec_pb2.Instance] = []
        self.ctx = KindContext(
            node_id="n1",
            data_dir=data,
            hw=FakeHardware("hgx-h100-8", "n1", state_dir=data / "hw"),
            cdi_dir=cdi_dir,
            boot_id="b",
            snapshots=self.snapshots,
            spec_instances=lambda: self.spec,
        )

    async def section(self, *instances: spec_pb2.Instance) -> SectionResult:
        """One pass of the converger over `instances`, which are also what `instance.snapshot` sees."""
        self.spec = list(instances)
        return await self.conv.converge(spec_pb2.InstancesSection(instances=instances), 1)

    def status(self, iid: str) -> common_pb2.InstanceStatus:
        (found,) = [s for s in self.conv.statuses if s.id == iid]
        return found

    async def woke(self) -> None:
        async with asyncio.timeout(self.woke_within_s):
            await self.woken.wait()
        self.woken.clear()

    async def snapshot(self, iid: str, url: str, memory: bool = True) -> KindResult:
        payload = any_pb2.Any()
        payload.Pack(kinds_pb2.InstanceSnapshotRequest(instance_id=iid, include_memory=memory, upload_url=url))
        executor = REGISTRY["instance.snapshot"]
        return await executor.run(self.ctx, executor.parse(payload))

    async def close(self) -> None:
        await self.snapshots.close()
        await self.rebinder.close()
