"""`bc secret set | list | rm | versions`: secrets in, never out.

`set` seals the value under the at-rest key (`bc.pki.secret_box`) as a new version and publishes
`secret.set` with the nodes whose current spec names the secret; every gateway reads that event
(`bc.gateway.secret_feed`) and tells those nodes' sessions to ask again, so a rotation re-delivers to
the sections that use it, and creating a secret a spec already named delivers it. A new secret needs a
scope; setting an existing one keeps its scope unless a new one is given. Nothing here returns a value:
list and versions show names, versions, scopes, who and when.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from google.protobuf import json_format

from bc.control.base import actor
from bc.control.base.bus import Bus
from bc.control.base.events import publish
from bc.control.secrets.scope import Scope
from bc.errors import NotFound, UsageError
from bc.pki.secret_box import SecretBox
from bc.protocol import secret_refs
from bc.protocol.pb import spec_pb2
from bc.store import Row, Store, Tx
from bc.store import secrets as secrets_sql

MAX_VALUE_BYTES = 64 * 1024
"""A secret is a token, a header, a small file: 64 KiB, well inside a session frame once sealed as a JWE."""


@dataclass(frozen=True)
class SecretRow:
    row: Row
    used_by: list[str]

    @property
    def scope(self) -> Scope:
        return Scope(tuple(json.loads(self.row["scope_nodes"])), tuple(json.loads(self.row["scope_labels"])))


async def users(tx: Tx) -> dict[str, list[str]]:
    """Secret name → the "<node>/<section>" of every live node whose current spec names it."""
    out: dict[str, list[str]] = {}
    for r in await secrets_sql.node_specs(tx):
        spec = json_format.Parse(str(r["spec"] or "{}"), spec_pb2.NodeSpec(), ignore_unknown_fields=True)
        for ref in secret_refs.refs(spec):
            out.setdefault(ref.name, []).append(f"{r['node_id']}/{ref.where}")
    return out


def _nodes_of(used_by: Iterable[str]) -> list[str]:
    return sorted({u.split("/", 1)[0] for u in used_by})


async def set_secret(
    store: Store, bus: Bus | None, box: SecretBox, name: str, value: bytes, scope: Scope | None
) -> SecretRow:
    secret_refs.check_name(name)
    if not value:
        raise UsageError(f"the value for secret {name!r} is empty")
    if len(value) > MAX_VALUE_BYTES:
        raise UsageError(f"the value for secret {name!r} is {len(value)} bytes; at most {MAX_VALUE_BYTES}")
    by = actor.current()
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        old = await secrets_sql.get(tx, name)
        if scope is None:
            if old is None:
                raise UsageError(
                    f"secret {name!r} is new: say which nodes may read it (--node NODE, --label KEY=VALUE)"
                )
            scope = Scope(tuple(json.loads(old["scope_nodes"])), tuple(json.loads(old["scope_labels"])))
        if scope.empty:
            raise UsageError(f"secret {name!r} needs a scope: --node NODE or --label KEY=VALUE, at least one")
        version = await secrets_sql.next_version(tx, name)
        sealed = box.seal(name, version, value)
        written = await secrets_sql.put(
            tx, name, sealed, box.key_id, json.dumps(list(scope.nodes)), json.dumps(list(scope.labels)), by, now_ms
        )
        assert written == version, "one writer: the version sealed is the version stored"
        used_by = (await users(tx)).get(name, [])
        await publish(
            tx,
            bus,
            "secret.set",
            name,
            {
                "name": name,
                "version": version,
                "nodes": _nodes_of(used_by),
                "scope_nodes": list(scope.nodes),
                "scope_labels": list(scope.labels),
            },
            now_ms,
        )
        row = await secrets_sql.get(tx, name)
    assert row is not None
    return SecretRow(row, used_by)


async def list_secrets(store: Store) -> list[SecretRow]:
    async with store.transaction(write=False) as tx:
        used = await users(tx)
        return [SecretRow(r, used.get(str(r["name"]), [])) for r in await secrets_sql.list_all(tx)]


async def remove_secret(store: Store, bus: Bus | None, name: str) -> SecretRow:
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        row = await secrets_sql.get(tx, name)
        if row is None:
            raise NotFound(f"no secret named {name!r}")
        used_by = (await users(tx)).get(name, [])
        await secrets_sql.remove(tx, name)
        await publish(tx, bus, "secret.removed", name, {"name": name, "still_named_by": used_by}, now_ms)
    return SecretRow(row, used_by)


async def versions(store: Store, name: str) -> list[Row]:
    async with store.transaction(write=False) as tx:
        if await secrets_sql.get(tx, name) is None:
            raise NotFound(f"no secret named {name!r}")
        return await secrets_sql.versions(tx, name)
