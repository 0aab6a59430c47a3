"""The Admin calls the TUI makes: `bc.client.admin.AdminClient` is the production one.

A Protocol, so that snapshot tests and the benchmark drive the app from a fake that
holds seeded replies (a seam we own, not a mock of gRPC).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Protocol

from bc.protocol.pb import admin_pb2, metal_pb2, tunnel_pb2


class Source(Protocol):
    @property
    def server(self) -> str: ...

    async def server_info(self) -> admin_pb2.ServerInfoResponse: ...

    async def fleet_snapshot(self, *, include_deleted: bool = False) -> admin_pb2.ListNodesResponse: ...

    async def get_node(self, node_id: str) -> admin_pb2.NodeInfo: ...

    async def list_commands(
        self, *, node_id: str = "", state: str = "", limit: int = 0
    ) -> list[admin_pb2.CommandInfo]: ...

    async def commands_snapshot(
        self, *, node_id: str = "", state: str = "", limit: int = 0
    ) -> admin_pb2.ListCommandsResponse: ...

    async def get_command(self, command_id: str) -> admin_pb2.CommandInfo: ...

    async def get_pki(self) -> admin_pb2.PkiInfo: ...

    async def cancel_command(self, command_id: str, *, reason: str = "") -> admin_pb2.CommandInfo: ...

    async def run_command(
        self,
        node_id: str,
        kind: str,
        *,
        payload_json: str = "",
        not_after_s: int = 0,
        min_generation: int = 0,
        idempotency_key: str = "",
    ) -> admin_pb2.CommandInfo: ...

    async def cordon_node(self, node_id: str, cordon: bool) -> admin_pb2.NodeInfo: ...

    async def list_reservations(
        self, *, node_id: str = "", include_released: bool = False, state: str = "", tenant: str = ""
    ) -> list[admin_pb2.Reservation]: ...

    async def usage(self, *, since_ms: int = 0, until_ms: int = 0, by: str = "") -> admin_pb2.UsageResponse: ...

    async def release(self, reservation_id: str) -> admin_pb2.Reservation: ...

    async def list_batches(self, *, state: str = "") -> list[admin_pb2.BatchInfo]: ...

    async def get_batch(self, batch_id: str) -> admin_pb2.BatchInfo: ...

    async def list_quorum_changes(self, *, state: str = "") -> list[admin_pb2.QuorumChangeInfo]: ...

    async def decide_batch(
        self,
        batch_id: str,
        key_id: str,
        signature: bytes,
        *,
        approve: bool,
        expires_at_ms: int = 0,
        reason: str = "",
    ) -> admin_pb2.BatchInfo: ...

    async def get_health(self) -> admin_pb2.HealthInfo: ...

    async def list_tunnels(self, *, node_id: str = "", open_only: bool = False) -> list[tunnel_pb2.TunnelRecord]: ...

    async def close_tunnel(self, sid: str, *, reason: str = "") -> tunnel_pb2.TunnelRecord: ...

    async def list_machines(self) -> metal_pb2.ListMachinesResponse: ...

    async def list_jobs(self, *, include_all: bool = False) -> admin_pb2.ListJobsResponse: ...

    async def cancel_job(self, dag_id: str) -> admin_pb2.CancelJobResponse: ...

    async def list_events(
        self, *, after_seq: int = 0, limit: int = 0, type_prefix: str = ""
    ) -> list[admin_pb2.EventRecord]: ...

    def watch(self, *, after_seq: int = 0, type_prefix: str = "") -> AsyncIterator[admin_pb2.EventRecord]: ...


# Opens one connection (a fresh channel per attempt, so a restarted server is found at once).
Connect = Callable[[], AbstractAsyncContextManager[Source]]
