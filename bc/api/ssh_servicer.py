"""The Admin API's break-glass SSH RPCs (docs/ssh.md): the user CA, grants, revocations.

A mixin of `AdminServicer` (which guards every RPC, `bc.api.admin_roles`), like `bc.api.capacity_servicer`:
each body calls `bc.control.trust.ssh` and maps its rows to messages; errors leave through `abort_with`.
"""

from __future__ import annotations

import random
from pathlib import Path

import grpc

from bc.api.calls import AdminCalls
from bc.control.base.bus import Bus
from bc.control.signing.signer import Signer
from bc.control.trust import ssh
from bc.pki.secrets_source import Secrets
from bc.protocol.pb import admin_pb2
from bc.store import Row, Store


def ca_info(row: Row | None, ca_dir: Path) -> admin_pb2.SshCaInfo:
    if row is None:
        return admin_pb2.SshCaInfo()
    return admin_pb2.SshCaInfo(
        public_key=str(row["public_key"]),
        fingerprint=str(row["fingerprint"]),
        created_by=str(row["created_by"]),
        created_at_ms=int(row["created_at_ms"]),
        key_path="" if ssh.is_offline(row) else str(ssh.key_path(ca_dir)),
        offline=ssh.is_offline(row),
    )


def grant_info(row: Row, batch_state: str = "") -> admin_pb2.SshGrantInfo:
    return admin_pb2.SshGrantInfo(
        serial=int(row["serial"]),
        node_id=str(row["node_id"]),
        principal=str(row["principal"]),
        login=f"{row['principal']}@{row['node_id']}",
        fingerprint=str(row["fingerprint"]),
        state=str(row["state"]),
        batch_id=str(row["batch_id"]),
        certificate=str(row["certificate"]),
        ttl_s=int(row["ttl_s"]),
        valid_after_ms=int(row["valid_after_ms"]),
        valid_before_ms=int(row["valid_before_ms"]),
        requested_by=str(row["requested_by"]),
        reason=str(row["reason"]),
        created_at_ms=int(row["created_at_ms"]),
        revoked_at_ms=int(row["revoked_at_ms"] or 0),
        revoked_by=str(row["revoked_by"]),
        revoke_reason=str(row["revoke_reason"]),
        batch_state=batch_state,
        signable=ssh.signable(row),
        public_key=str(row["public_key"]),
    )


class SshRpcs(AdminCalls):
    """The SSH RPCs; `AdminServicer` provides the store, bus, signer, Random, secrets and the CA directory."""

    store: Store
    bus: Bus
    signer: Signer
    rng: random.Random
    secrets: Secrets
    ssh_ca_dir: Path

    async def SshCaInit(
        self, request: admin_pb2.SshCaInitRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.SshCaInfo:
        async def go() -> admin_pb2.SshCaInfo:
            row = await ssh.ca_init(
                self.store, self.bus, self.signer, self.ssh_ca_dir, self.secrets, request.public_key
            )
            return ca_info(row, self.ssh_ca_dir)

        return await self._call(context, go)

    async def GetSshCa(
        self, request: admin_pb2.GetSshCaRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.SshCaInfo:
        async def go() -> admin_pb2.SshCaInfo:
            return ca_info(await ssh.get_ca(self.store), self.ssh_ca_dir)

        return await self._call(context, go)

    async def SshGrant(
        self, request: admin_pb2.SshGrantRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.SshGrantInfo:
        async def go(operator: str) -> admin_pb2.SshGrantInfo:
            req = ssh.GrantRequest(
                node_id=request.node_id,
                principal=request.principal,
                public_key=request.public_key,
                ttl_s=request.ttl_s or ssh.DEFAULT_TTL_S,
                reason=request.reason,
            )
            row = await ssh.grant(self.store, self.bus, self.signer, self.rng, self.ssh_ca_dir, req, operator)
            return grant_info(row, await ssh.batch_state_of(self.store, row))

        return await self._call_as(context, go)

    async def GetSshGrant(
        self, request: admin_pb2.GetSshGrantRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.SshGrantInfo:
        async def go() -> admin_pb2.SshGrantInfo:
            row = await ssh.fetch(self.store, self.bus, self.signer, self.ssh_ca_dir, request.serial, request.batch_id)
            return grant_info(row, await ssh.batch_state_of(self.store, row))

        return await self._call(context, go)

    async def ListSshGrants(
        self, request: admin_pb2.ListSshGrantsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ListSshGrantsResponse:
        async def go() -> admin_pb2.ListSshGrantsResponse:
            rows = await ssh.grants(self.store, request.node_id, request.live_only)
            return admin_pb2.ListSshGrantsResponse(grants=[grant_info(r) for r in rows])

        return await self._call(context, go)

    async def SshRevoke(
        self, request: admin_pb2.SshRevokeRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.SshGrantInfo:
        async def go(operator: str) -> admin_pb2.SshGrantInfo:
            row = await ssh.revoke(self.store, self.bus, self.signer, request.serial, request.reason, operator)
            return grant_info(row)

        return await self._call_as(context, go)

    async def SshRecordCert(
        self, request: admin_pb2.SshRecordCertRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.SshGrantInfo:
        async def go() -> admin_pb2.SshGrantInfo:
            row = await ssh.record_cert(self.store, self.bus, self.signer, request.serial, request.certificate)
            return grant_info(row, await ssh.batch_state_of(self.store, row))

        return await self._call(context, go)
