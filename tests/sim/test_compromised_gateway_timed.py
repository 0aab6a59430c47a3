"""A compromised gateway replaying an old signed spec, on virtual time (the 10 s backstop takes no wall time).

The production gateway's end of each session is wrapped in the tamperer of
tests/integration/test_compromised_gateway.py (the code a compromised gateway
would run); the control plane and the agent are `SessionPair`'s, unchanged.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bc.control.nodes.specs import set_section
from bc.protocol.pb import session_pb2
from bc.protocol.pb.session_pb2 import GatewayMessage, NodeMessage
from bc.seams.link import Link
from bc.sim.pair import SessionPair
from bc.store import events as events_sql
from tests.integration.test_compromised_gateway import Tamperer, TamperingLink


async def first_event(pair: SessionPair, type_: str, node_id: str, within_s: float = 60) -> dict[str, Any]:
    async with asyncio.timeout(within_s):
        while True:
            async with pair.store.transaction(write=False) as tx:
                for r in await events_sql.list_events(tx, 0, 10_000, type_):
                    if r["subject"] == node_id:
                        return dict(json.loads(str(r["data"])))
            await asyncio.sleep(0.5)


async def until(cond: Callable[[], bool], within_s: float = 60) -> None:
    async with asyncio.timeout(within_s):
        while not cond():
            await asyncio.sleep(0.5)


def generation_of(msg: GatewayMessage) -> int:
    if not msg.HasField("desired_state"):
        return 0
    return session_pb2.DesiredStateBody.FromString(msg.desired_state.envelope.body).generation


async def test_an_old_signed_spec_replayed_with_a_higher_generation_is_not_applied(tmp_path: Path) -> None:
    t = Tamperer()

    def wrap(node_id: str, link: Link[NodeMessage, GatewayMessage]) -> Link[NodeMessage, GatewayMessage]:
        return TamperingLink(link, t)

    pair = SessionPair(tmp_path, seed=2, agents=1)
    pair.network.wrap = wrap
    await pair.start()
    try:
        agent = pair.agents["n000"]
        await until(lambda: hasattr(agent, "state") and agent.applied_generation >= 1)  # opened, then applied
        old = next(m.desired_state.envelope for m in t.seen_out if m.HasField("desired_state"))
        assert pair.cp is not None
        cp = pair.cp

        # A newer generation arrives, signed; the tamperer keeps it from the node and replays the old body
        # relabelled with a generation above it instead.
        def replay(msg: GatewayMessage) -> GatewayMessage:
            if msg.HasField("desired_state"):
                body = session_pb2.DesiredStateBody.FromString(old.body)
                body.generation = 50
                msg.desired_state.envelope.CopyFrom(old)
                msg.desired_state.envelope.body = body.SerializeToString(deterministic=True)
            return msg

        t.outbound = replay
        await set_section(pair.store, cp.bus, cp.signer, "n000", "telemetry", json.dumps({"export_interval_s": 30}))
        sec = await first_event(pair, "security.spec-rejected", "n000")
        assert sec["generation"] == 50 and "does not match" in sec["reason"]
        assert agent.applied_generation == 1

        # The untouched old envelope itself is simply not newer: ignored, never applied again.
        def old_envelope(msg: GatewayMessage) -> GatewayMessage:
            if msg.HasField("desired_state"):
                msg.desired_state.envelope.CopyFrom(old)
            return msg

        t.outbound = old_envelope
        await set_section(pair.store, cp.bus, cp.signer, "n000", "telemetry", json.dumps({"export_interval_s": 60}))
        await until(lambda: any(generation_of(m) == 3 for m in t.seen_out))
        assert agent.applied_generation == 1

        # Once the gateway relays honestly again, the stored newest generation lands: the 10 s backstop
        # resends it while the node still reports an older one.
        t.outbound = None
        honest_at = pair.clock.monotonic()
        await until(lambda: agent.applied_generation == 3, within_s=30)
        assert pair.clock.monotonic() - honest_at <= 11
    finally:
        await pair.stop()
