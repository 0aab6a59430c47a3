"""The health policy's writes: `bc health policy set` stores a new version, validated first (docs/health.md).

Every set is a new version (one more than the newest) with who set it, when and why, and a
`health.policy.set` event; nothing is ever overwritten, so `bc health policy show` can say which version
an episode was opened under (`health_episodes.policy_version`). A policy that does not parse stores
nothing: one `UsageError` naming the first thing wrong. A version's pre-approvals count only once the
approvers signed it (`bc.control.health.preapprovals`).
"""

from __future__ import annotations

import random

from bc.control.base.bus import Bus
from bc.control.base.events import publish
from bc.control.health import policy as pol
from bc.control.health import preapprovals
from bc.errors import UsageError
from bc.pki import preapproval as pre
from bc.store import Store
from bc.store import health as health_sql

MAX_REASON = 500


async def set_policy(
    store: Store,
    bus: Bus | None,
    text: str,
    set_by: str,
    reason: str = "",
    rng: random.Random | None = None,
) -> int:
    """Validate `text` and store it as the newest version; returns the version. A version that names
    pre-approvals also opens their batch for the approvers (`bc.control.health.preapprovals`), in the same
    transaction: `rng` draws its id."""
    policy = pol.parse(text)
    if len(reason) > MAX_REASON:
        raise UsageError(f"the reason is longer than {MAX_REASON} characters")
    now_ms = await store.now_ms()
    pre.check_lifetimes(policy.preapprove, now_ms)
    async with store.transaction() as tx:
        version = await health_sql.add_policy(tx, policy.text(), set_by, reason, now_ms)
        data = {"version": version, "set_by": set_by, "reason": reason, "policy": policy.doc()}
        await publish(tx, bus, "health.policy.set", f"v{version}", data, now_ms)
        await preapprovals.open_batch(tx, bus, rng, version, policy, set_by, now_ms)
    return version
