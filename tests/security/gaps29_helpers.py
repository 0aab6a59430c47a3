"""Shared by the gaps29 security tests: a node guarded by approvers, and a signature sent past the API.

Nothing here imports the code under test beyond the Admin API, the lab
fixtures and `bc.control.quorum.batches.decide` (what ApproveBatch records), so each
test fails on a tree without the fix for the reason it names.
"""

from __future__ import annotations

from bc.control.quorum import batches as quorum
from bc.pki import quorum as q
from bc.protocol.pb import admin_pb2
from tests.integration.conftest import InprocLab
from tests.integration.operators_lab import Approver, approvers
from tests.security.rootequiv_helpers import holds_approvers, host, node

CORE_PIPE = host({"sysctl": {"kernel.core_pattern": "|/usr/lib/crash-handler %p"}})
"""A root-equivalent host section: core dumps piped to a program the kernel runs as root."""


async def guarded(lab: InprocLab, node_id: str = "n1", n: int = 2, k: int = 2) -> list[Approver]:
    """A connected node that holds `n` approvers with threshold `k`."""
    await node(lab, node_id)
    quorum_ = await approvers(lab, n=n, k=k)
    await holds_approvers(lab, n, node_id)
    return quorum_


async def record_approval(lab: InprocLab, b: admin_pb2.BatchInfo, a: Approver, ttl_ms: int = 600_000) -> None:
    """Record `a`'s signature as ApproveBatch does, and nothing after it: the process died right there."""
    server = lab.server
    now_ms = await server.store.now_ms()
    expires = now_ms + ttl_ms
    msg = q.approval_message(b.id, bytes.fromhex(b.scope_root), len(b.leaves), b.requested_by, expires)
    await quorum.decide(
        server.store, server.bus, b.id, a.key_id, a.key.sign(msg), approve=True, caller=a.name, expires_at_ms=expires
    )
