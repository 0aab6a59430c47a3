"""One process per gateway id: who holds a gateway's lease, and what a renewal's answer means.

The lease `gateway:<id>` is held under a holder string of its own per process, `<id>@<host>:<data dir>`:
a restart from the same data dir (which `bc.assembly.lock` keeps to one process) takes it back at once, while
a second `bc serve --gateway-id <id>` from another data dir or host is another holder. That second one is
refused at start while the first holds the lease (`refusal`, exit 4). Each time the lease passes to another
holder its epoch grows by one (migration 0021); a process remembers the epoch it took it at, so if one
sneaked past (the first paused past the lease's TTL, the second took the lease, then the first came back)
the first finds a later epoch at its next renewal and is superseded: it stops acting, for good, rather than
take the lease back and route, and ask for serving certificates, in turn with the other.
"""

from __future__ import annotations

import enum
from pathlib import Path

from bc.store.leases import Claim, Lease


class Renewal(enum.Enum):
    HELD = "held"  # this process holds the lease
    MOVED = "moved"  # another holder has it, at this process's epoch: fence, and try again
    SUPERSEDED = "superseded"  # another process took the lease after this one did: stop acting


def name_of(gateway_id: str) -> str:
    return f"gateway:{gateway_id}"


def holder_for(gateway_id: str, host: str, data_dir: Path) -> str:
    return f"{gateway_id}@{host}:{data_dir}"


def judge(claim: Claim, got: Lease) -> Renewal:
    """What a take of the lease says about `claim`; a HELD one adopts the row's epoch (a first take, or a row
    deleted and made again)."""
    if claim.epoch and got.epoch > claim.epoch:
        return Renewal.SUPERSEDED
    if got.holder != claim.holder:
        return Renewal.MOVED
    claim.epoch = got.epoch
    return Renewal.HELD


def refusal(gateway_id: str, got: Lease, now_ms: int) -> str:
    """The one sentence a second process under a running gateway's id exits with."""
    left = max(0, (got.expires_at_ms - now_ms + 999) // 1000)
    return (
        f"gateway {gateway_id} is already running on this store: {got.holder} holds its lease (for {left} s more"
        f" unless renewed); stop that bc serve, or give this one another --gateway-id"
    )


def superseded(gateway_id: str, claim: Claim, got: Lease) -> str:
    return (
        f"gateway {gateway_id}: another bc serve ({got.holder}) took its lease at epoch {got.epoch} after this one"
        f" (epoch {claim.epoch}); this one stopped acting and exits (two processes share --gateway-id {gateway_id})"
    )
