"""The trust nodes hold, from where this process gets it: signed here (`LocalTrust`) or relayed (`RelayedTrust`).

A process that holds the signing keys keeps the trust bundle in its `Intent`
and signs it; `LocalTrust.refresh` reads the quorum settings and release keys
from the store and publishes the CA certificate, the bundle and its signed
envelope to the store (`published_trust`) whenever they change. A gateway-only
process holds no key: `RelayedTrust` reads those bytes back and hands them to
Welcome and to open sessions verbatim, so it can neither strip nor add a root.
"""

from __future__ import annotations

import logging
from typing import Protocol

from bc.control.quorum import approvers
from bc.control.trust import releases as release_ctl
from bc.control.trust.intent import Intent
from bc.protocol.pb import common_pb2
from bc.seams.clock import Clock
from bc.store import Store, StoreError
from bc.store import gateway_keys as gk_sql

CA_PEM, BUNDLE, ENVELOPE = "ca.pem", "trust.bundle", "trust.envelope"
PUBLISH_POLL_S = 1.0
"""How often a key-holding process without the gateway role re-reads and republishes its trust."""

log = logging.getLogger("bc.control.trust.sources")


class TrustSource(Protocol):
    def trust_bundle(self) -> common_pb2.TrustBundle: ...

    def trust_envelope(self) -> common_pb2.Envelope | None: ...

    async def refresh(self, store: Store) -> bool:
        """Take what changed in the store; True when the bundle nodes should hold changed."""


class LocalTrust:
    """The bundle as this process's `Intent` holds and signs it, published for the keyless gateways."""

    def __init__(self, intent: Intent) -> None:
        self.intent = intent
        self._published: dict[str, bytes] = {}

    def trust_bundle(self) -> common_pb2.TrustBundle:
        return self.intent.trust_bundle()

    def trust_envelope(self) -> common_pb2.Envelope | None:
        return self.intent.trust_envelope()

    async def refresh(self, store: Store) -> bool:
        intent = self.intent
        changed = intent.set_quorum(*await approvers.trust_state(store))
        release_keys = await release_ctl.release_keys(store)
        changed = intent.set_release_keys(release_keys, await release_ctl.endorsements(store)) or changed
        await self.publish(store)
        return changed

    async def publish(self, store: Store) -> None:
        """Write the CA certificate, the bundle and its envelope where this process last wrote something else."""
        env = self.intent.trust_envelope()
        now = {
            CA_PEM: self.intent.ca_pem,
            BUNDLE: self.intent.trust_bundle().SerializeToString(deterministic=True),
            ENVELOPE: env.SerializeToString(deterministic=True) if env is not None else b"",
        }
        todo = {k: v for k, v in now.items() if self._published.get(k) != v}
        if not todo:
            return
        now_ms = await store.now_ms()
        async with store.transaction() as tx:
            for name, value in sorted(todo.items()):
                await gk_sql.put_published(tx, name, value, now_ms)
        self._published.update(todo)


class RelayedTrust:
    """The bundle and envelope a key-holding process published, relayed as stored."""

    def __init__(self) -> None:
        self._stored: dict[str, bytes] = {}
        self._bundle = common_pb2.TrustBundle()
        self._envelope: common_pb2.Envelope | None = None

    @property
    def ca_pem(self) -> bytes:
        return self._stored.get(CA_PEM, b"")

    @property
    def ready(self) -> bool:
        """Whether a key-holding process has published the CA and the bundle yet."""
        return bool(self._stored.get(CA_PEM)) and BUNDLE in self._stored

    def trust_bundle(self) -> common_pb2.TrustBundle:
        out = common_pb2.TrustBundle()
        out.CopyFrom(self._bundle)
        return out

    def trust_envelope(self) -> common_pb2.Envelope | None:
        if self._envelope is None:
            return None
        out = common_pb2.Envelope()
        out.CopyFrom(self._envelope)
        return out

    async def refresh(self, store: Store) -> bool:
        async with store.transaction(write=False) as tx:
            stored = await gk_sql.published(tx)
        if stored == self._stored:
            return False
        before = (self._stored.get(BUNDLE), self._stored.get(ENVELOPE))
        self._stored = stored
        self._bundle = common_pb2.TrustBundle.FromString(stored.get(BUNDLE, b""))
        env = stored.get(ENVELOPE, b"")
        self._envelope = common_pb2.Envelope.FromString(env) if env else None
        return before != (stored.get(BUNDLE), stored.get(ENVELOPE))


async def publish_forever(trust: TrustSource, store: Store, clock: Clock) -> None:
    """A key-holding process without the gateway role: keep its bundle current and published.

    (A gateway refreshes and publishes the trust on its own revocation feed.)
    """
    while True:
        await clock.sleep(PUBLISH_POLL_S)
        try:
            await trust.refresh(store)
        except StoreError as e:
            log.warning("event=trust.publish-failed error=%s", e)
