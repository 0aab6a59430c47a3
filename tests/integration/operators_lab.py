"""Operators and approvers for the in-process lab, made the way an admin makes them.

`add_operator` is `bc operators add` without the file: a key made here, a
certificate from the server, an operator config in memory. `approvers` builds
an approver set the way an install does: one operator per approver, each key
added with `AddApprover`, every change after the first signed by the
approvers already there, each under their own operator's certificate.
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from bc.client.admin import AdminClient
from bc.pki import keys
from bc.pki import quorum as q
from bc.protocol.pb import admin_pb2
from bc.runtime.config import OperatorConfig
from tests.integration.conftest import InprocLab

T = TypeVar("T")


def raw(key: ed25519.Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def b64(key: ed25519.Ed25519PrivateKey) -> str:
    return base64.b64encode(raw(key)).decode()


async def add_operator(lab: InprocLab, name: str, role: str = "operator") -> OperatorConfig:
    key = keys.generate_key()
    pub = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    resp = await lab.admin.add_operator(name, role, pub)
    return OperatorConfig(
        server=lab.server.address,
        ca_pem=resp.ca_pem,
        cert_pem=resp.cert_pem,
        key_pem=keys.key_to_pem(key),
        data_dir="",
        path=Path(f"<{name}>"),
    )


async def as_operator(cfg: OperatorConfig, fn: Callable[[AdminClient], Awaitable[T]]) -> T:
    """One call under `cfg`'s certificate, on its own channel."""
    async with AdminClient(cfg) as client:
        return await fn(client)


@dataclass(frozen=True)
class Approver:
    name: str
    key: ed25519.Ed25519PrivateKey
    config: OperatorConfig  # the operator the key is registered to

    @property
    def key_id(self) -> str:
        return q.key_id(raw(self.key))


async def sign_change(lab: InprocLab, change_id: str, signers: list[Approver]) -> admin_pb2.QuorumChangeInfo:
    """Approve a pending quorum change with `signers` (each under its own certificate) until it applies."""
    c = await lab.admin.get_quorum_change(change_id)
    msg = q.change_message(c.id, q.settings_digest(c.from_settings), q.settings_digest(c.to_settings), c.requested_by)
    for a in signers:
        if c.state != "pending":
            break
        sig = a.key.sign(msg)
        c = await as_operator(
            a.config, lambda cl, a=a, sig=sig: cl.decide_quorum_change(change_id, a.key_id, sig, approve=True)
        )
    return c


async def settle(lab: InprocLab, s: admin_pb2.ApproverSet, signers: list[Approver]) -> admin_pb2.ApproverSet:
    """The set after a change request: a pending change gets signed by `signers` first."""
    if s.HasField("change") and s.change.state == "pending":
        done = await sign_change(lab, s.change.id, signers)
        assert done.state == "applied", done
        return await lab.admin.list_approvers()
    return s


async def approvers(lab: InprocLab, n: int = 3, k: int = 2, prefix: str = "approver") -> list[Approver]:
    """n approvers (each with its own operator of the same name), then k; every change signed as needed."""
    out: list[Approver] = []
    for i in range(n):
        name = f"{prefix}{i}"
        cfg = await add_operator(lab, name)
        key = ed25519.Ed25519PrivateKey.generate()
        await settle(lab, await lab.admin.add_approver(name, b64(key)), out)
        out.append(Approver(name, key, cfg))
    s = await settle(lab, await lab.admin.set_approver_threshold(k), out)
    assert s.threshold == k and len(s.approvers) == n, s
    return out


async def sign(lab: InprocLab, b: admin_pb2.BatchInfo, a: Approver, ttl_ms: int = 600_000) -> admin_pb2.BatchInfo:
    """`bc approve sign` for a batch: the approver's signature, sent under its operator's certificate."""
    now_ms = (await lab.admin.server_info()).server_time_ms
    expires = now_ms + ttl_ms
    msg = q.approval_message(b.id, bytes.fromhex(b.scope_root), len(b.leaves), b.requested_by, expires)
    sig = a.key.sign(msg)
    return await as_operator(
        a.config, lambda c: c.decide_batch(b.id, a.key_id, sig, approve=True, expires_at_ms=expires)
    )
