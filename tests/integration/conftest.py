"""An in-process lab: a real `bc serve` (gRPC, mutual TLS, SQLite file) and real agents on fake GPUs.

Everything here is the production code path; only the GPUs are fake. Tests
wait on the events log (Admin Watch), never on wall-clock sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agent.app import Agent, AgentOptions
from agent.join import join_node
from bc.assembly.roles import parse_roles
from bc.assembly.server import Seams, ServeOptions, Server
from bc.client.admin import AdminClient
from bc.client.tunnel import TunnelClient
from bc.protocol.pb import admin_pb2
from bc.runtime.config import OperatorConfig
from tests.pg import recycled_schema, schema_url


@dataclass
class InprocLab:
    root: Path
    server: Server
    admin: AdminClient
    agents: dict[str, Agent] = field(default_factory=dict)
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)

    def node_dir(self, node_id: str) -> Path:
        return self.root / f"node-{node_id}"

    async def join(self, node_id: str) -> None:
        tok = await self.admin.create_token(node_id)
        await join_node(self.server.address, tok.token, self.node_dir(node_id))

    async def start_node(self, node_id: str, profile: str = "hgx-h100-8") -> Agent:
        agent = Agent(AgentOptions(data_dir=self.node_dir(node_id), fake_hw=profile, heartbeat_interval_s=1.0))
        self.agents[node_id] = agent
        self.tasks[node_id] = asyncio.create_task(agent.run(), name=f"agent-{node_id}")
        return agent

    async def stop_node(self, node_id: str) -> None:
        agent = self.agents.pop(node_id)
        agent.stopped.set()
        await asyncio.wait_for(self.tasks.pop(node_id), 10)

    async def wait_event(
        self, type_prefix: str, pred: Callable[[admin_pb2.EventRecord, dict[str, Any]], bool], timeout: float = 15.0
    ) -> admin_pb2.EventRecord:
        """The first event (from the start of the log) of this type that satisfies `pred`."""

        async def find() -> admin_pb2.EventRecord:
            async for ev in self.admin.watch(type_prefix=type_prefix):
                if pred(ev, json.loads(ev.data_json)):
                    return ev
            raise AssertionError("the event stream ended")

        return await asyncio.wait_for(find(), timeout)

    async def wait_observed(self, node_id: str, generation: int, timeout: float = 15.0) -> None:
        await self.wait_event(
            "node.observed",
            lambda ev, d: ev.subject == node_id and d["observed_generation"] >= generation,
            timeout,
        )

    async def wait_connected(self, node_id: str, after_seq: int = 0, timeout: float = 15.0) -> admin_pb2.EventRecord:
        return await self.wait_event(
            "node.connectivity",
            lambda ev, d: ev.subject == node_id and ev.seq > after_seq and d["state"] == "connected",
            timeout,
        )


@contextlib.asynccontextmanager
async def open_lab(tmp_path: Path, seams: Seams | None = None, **serve: Any) -> AsyncIterator[InprocLab]:
    """A started `bc serve` (options as `ServeOptions` fields) with an operator client; stopped afterwards.

    `seams` replaces the production ones, e.g. a clock a test steps (`LoopClock(wall_offset=…)`)."""
    opts = {"data_dir": tmp_path / "server", "listen": "127.0.0.1:0", "heartbeat_interval_s": 1.0, **serve}
    server = Server(ServeOptions(**opts), seams or Seams.production())
    await server.start()
    cfg = OperatorConfig.load(server.operator_config)
    admin = AdminClient(cfg)
    await admin.__aenter__()
    lab = InprocLab(tmp_path, server, admin)
    try:
        yield lab
    finally:
        for node_id in list(lab.agents):
            with contextlib.suppress(Exception):
                await lab.stop_node(node_id)
        await admin.__aexit__(None, None, None)
        # A test may have restarted the server (lab.server is then another one): stop both, or the restarted
        # one's store thread and gRPC server outlive the test and stall the next one's teardown.
        await server.stop()
        if lab.server is not server:
            await lab.server.stop()


def role_options(data_dir: Path, store: str, roles: str, name: str, serving_cert_wait_s: float) -> ServeOptions:
    """`bc serve --roles ROLES --gateway-id NAME` (e.g. `gateway` or `gateway,worker`) beside a lab on its store,
    on a port of its own."""
    return ServeOptions(
        data_dir=data_dir,
        listen="127.0.0.1:0",
        heartbeat_interval_s=1.0,
        store=store,
        gateway_id=name,
        roles=parse_roles(roles),
        serving_cert_wait_s=serving_cert_wait_s,
    )


def gateway_only_server(data_dir: Path, store: str, gateway_id: str = "gw-k") -> Server:
    """A `bc serve --roles gateway` beside a lab on its store (not started): it holds no key and waits up to
    30 s for the serving certificate an api process issues it into the store."""
    return Server(role_options(data_dir, store, "gateway", gateway_id, 30.0), Seams.production())


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def store_url(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """The store a lab's `bc serve` runs on: its SQLite file, or a PostgreSQL schema of its own."""
    if request.param == "sqlite":
        yield ""
        return
    async with recycled_schema() as (url, schema):
        yield schema_url(url, schema)


@pytest.fixture
async def lab(tmp_path: Path, store_url: str) -> AsyncIterator[InprocLab]:
    async with open_lab(tmp_path, store=store_url) as lab:
        yield lab


def tunnel_client(lab: InprocLab) -> TunnelClient:
    """A tunnel client as the lab's local operator."""
    assert lab.server.operator_config is not None
    return TunnelClient(OperatorConfig.load(lab.server.operator_config))
