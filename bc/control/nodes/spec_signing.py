"""Signing the spec generations a keyless gateway wrote (an allocation report that changed a node's spec).

A gateway-only process holds no worker key, so the spec it writes is stored
`spec_sign_pending` and no gateway delivers it. Every process that holds the
worker key runs `SpecSigner`: woken by any node change (the bus, relayed across
processes over LISTEN/NOTIFY) and every `BACKSTOP_S` otherwise, it signs the
waiting generations (the body as stored, never re-encoded) and pokes their
nodes, whose gateways then send the signed spec. A generation bumped in the
meantime carries its own signature or its own pending mark, so signing an
older one changes nothing.
"""

from __future__ import annotations

import asyncio
import functools
import logging

from bc.control.base.bus import Bus
from bc.control.signing.signer import Signer
from bc.runtime.aio import wait_event
from bc.store import Store, StoreError
from bc.store import gateway_keys as gk_sql

log = logging.getLogger("bc.spec_signing")

BACKSTOP_S = 2.0


async def sign_pending(store: Store, bus: Bus | None, signer: Signer) -> list[str]:
    """Sign every waiting generation; the nodes whose spec was signed."""
    if signer.keys is None:
        return []
    signed: list[str] = []
    async with store.transaction() as tx:
        for r in await gk_sql.specs_to_sign(tx):
            node_id = str(r["node_id"])
            sig = signer.sign_spec(bytes(r["spec_body"]))
            if await gk_sql.sign_spec(tx, node_id, int(r["generation"]), sig.stored, sig.key_id):
                signed.append(node_id)
        if bus is not None:
            for node_id in signed:
                tx.on_commit(functools.partial(bus.node_changed, node_id))
    if signed:
        log.info("event=spec.signed-for-gateway nodes=%d", len(signed))
    return signed


class SpecSigner:
    def __init__(self, store: Store, bus: Bus, signer: Signer) -> None:
        self.store, self.bus, self.signer = store, bus, signer
        self._wake = asyncio.Event()
        bus.on_node_changed(lambda _node: self._wake.set())

    async def run_forever(self) -> None:
        while True:
            self._wake.clear()
            try:
                await sign_pending(self.store, self.bus, self.signer)
            except StoreError as e:
                log.warning("event=spec.signing-failed error=%s", e)
            await wait_event(self._wake, BACKSTOP_S)
