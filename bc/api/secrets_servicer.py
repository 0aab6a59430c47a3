"""The Admin API's secret RPCs (docs/secrets.md): set, list, remove, versions. A value goes in and never out.

A mixin of `AdminServicer` (which guards every RPC, `bc.api.admin_roles`: writes are admin's, reads a
viewer's, and they show names, versions, scopes and who, never a value).
"""

from __future__ import annotations

import grpc

from bc.api.calls import AdminCalls
from bc.control.base.bus import Bus
from bc.control.secrets import admin as secrets_ctl
from bc.control.secrets import scope as scope_rule
from bc.errors import Unavailable
from bc.pki.secret_box import SecretBox
from bc.protocol.pb import secrets_pb2
from bc.store import Row, Store


def secret_info(s: secrets_ctl.SecretRow) -> secrets_pb2.SecretInfo:
    r = s.row
    return secrets_pb2.SecretInfo(
        name=str(r["name"]),
        version=int(r["version"]),
        scope=secrets_pb2.SecretScope(nodes=list(s.scope.nodes), labels=list(s.scope.labels)),
        created_by=str(r["created_by"]),
        created_at_ms=int(r["created_at_ms"]),
        updated_by=str(r["updated_by"]),
        updated_at_ms=int(r["updated_at_ms"]),
        used_by=s.used_by,
    )


def version_info(r: Row) -> secrets_pb2.SecretVersionInfo:
    return secrets_pb2.SecretVersionInfo(
        version=int(r["version"]), set_by=str(r["set_by"]), set_at_ms=int(r["set_at_ms"]), key_id=str(r["key_id"])
    )


class SecretRpcs(AdminCalls):
    """`AdminServicer` provides the store, the bus and the at-rest key (None: this process has no CA directory)."""

    store: Store
    bus: Bus
    secret_box: SecretBox | None

    def _box(self) -> SecretBox:
        if self.secret_box is None:
            raise Unavailable("this server holds no secrets key (no CA directory): set secrets through one that does")
        return self.secret_box

    async def SetSecret(
        self, request: secrets_pb2.SetSecretRequest, context: grpc.aio.ServicerContext
    ) -> secrets_pb2.SecretInfo:
        async def go() -> secrets_pb2.SecretInfo:
            scope = scope_rule.parse(request.scope.nodes, request.scope.labels) if request.set_scope else None
            row = await secrets_ctl.set_secret(self.store, self.bus, self._box(), request.name, request.value, scope)
            return secret_info(row)

        return await self._call(context, go)

    async def ListSecrets(
        self, request: secrets_pb2.ListSecretsRequest, context: grpc.aio.ServicerContext
    ) -> secrets_pb2.ListSecretsResponse:
        async def go() -> secrets_pb2.ListSecretsResponse:
            return secrets_pb2.ListSecretsResponse(
                secrets=[secret_info(s) for s in await secrets_ctl.list_secrets(self.store)]
            )

        return await self._call(context, go)

    async def RemoveSecret(
        self, request: secrets_pb2.RemoveSecretRequest, context: grpc.aio.ServicerContext
    ) -> secrets_pb2.SecretInfo:
        async def go() -> secrets_pb2.SecretInfo:
            return secret_info(await secrets_ctl.remove_secret(self.store, self.bus, request.name))

        return await self._call(context, go)

    async def ListSecretVersions(
        self, request: secrets_pb2.ListSecretVersionsRequest, context: grpc.aio.ServicerContext
    ) -> secrets_pb2.ListSecretVersionsResponse:
        async def go() -> secrets_pb2.ListSecretVersionsResponse:
            rows = await secrets_ctl.versions(self.store, request.name)
            return secrets_pb2.ListSecretVersionsResponse(name=request.name, versions=[version_info(r) for r in rows])

        return await self._call(context, go)
