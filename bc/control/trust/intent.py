"""What nodes must trust, as one bundle; publishing the worker key; rotating it.

`Intent` holds the trust bundle nodes receive (JoinResponse, RenewResponse,
Welcome, and pushed to open sessions when it changes): the CA, the
command-signing roots of its `Signer`, and the quorum settings with the
approved changes that lead to them. With signing on the bundle is itself
signed (`Signer.sign_trust_bundle`), so a gateway can neither strip nor add a
root. The quorum settings come in from outside (`set_quorum`, fed from
`bc.control.quorum.approvers.trust_state` by whoever polls the store): this module
imports no other control module but the events log, so `bc.control` has no
import cycle (an import-linter contract holds it).

`register` publishes the worker certificate to the store, so every gateway
can relay it with what it signed; `rotate` issues a new worker key and
re-signs what may still be delivered.
"""

from __future__ import annotations

import logging
import random

from bc.control.base.bus import Bus
from bc.control.base.events import publish
from bc.control.signing.signer import Signer
from bc.pki.secrets_source import Secrets
from bc.protocol.pb import common_pb2
from bc.seams.clock import Clock
from bc.store import Store
from bc.store import signing as signing_sql

log = logging.getLogger("bc.intent")


class Intent:
    def __init__(self, signer: Signer, ca_pem: bytes) -> None:
        self.signer = signer
        self.ca_pem = ca_pem
        self.quorum = common_pb2.QuorumSettings()  # what nodes hold: approver keys, k, allowance, version
        self.quorum_changes: list[common_pb2.QuorumChange] = []  # the approved path to it (agent.trust walks it)
        self.version = 0  # bumped whenever the bundle nodes should hold changes
        self.release_keys: list[bytes] = []  # raw Ed25519 keys that sign releases (docs/self-update.md)
        self.release_endorsements: list[common_pb2.ReleaseKeyEndorsement] = []  # the root's signature of each
        self._envelope: tuple[tuple[int, str], common_pb2.Envelope | None] | None = None

    @property
    def approvers(self) -> list[common_pb2.ApproverKey]:
        return list(self.quorum.approver_keys)

    def set_quorum(self, quorum: common_pb2.QuorumSettings, changes: list[common_pb2.QuorumChange]) -> bool:
        """Take the quorum settings and their changes as read from the store; True when the bundle changed
        (gateways then push it to open sessions)."""
        if quorum == self.quorum and changes == self.quorum_changes:
            return False
        self.quorum, self.quorum_changes = quorum, list(changes)
        self.version += 1
        return True

    def set_release_keys(
        self, release_keys: list[bytes], endorsements: list[common_pb2.ReleaseKeyEndorsement] | None = None
    ) -> bool:
        """Take the release keys and the root's endorsements of them as read from the store (`bc release key
        add`); True when the bundle changed."""
        endorsed = list(endorsements or [])
        if release_keys == self.release_keys and endorsed == self.release_endorsements:
            return False
        self.release_keys, self.release_endorsements = list(release_keys), endorsed
        self.version += 1
        return True

    def trust_bundle(self) -> common_pb2.TrustBundle:
        b = common_pb2.TrustBundle(ca_pem=self.ca_pem)
        b.release_keys.extend(self.release_keys)
        b.release_key_endorsements.extend(self.release_endorsements)
        b.command_signing_roots.extend(self.signer.roots())
        q = self.quorum
        b.approver_keys.extend(q.approver_keys)
        b.quorum_k, b.unbatched_destructive_per_hour, b.quorum_version = (
            q.quorum_k,
            q.unbatched_destructive_per_hour,
            q.version,
        )
        b.quorum_changes.extend(self.quorum_changes)
        return b

    def trust_envelope(self) -> common_pb2.Envelope | None:
        """The bundle as the signer signs it (None when signing is off), made once per bundle and worker key."""
        keys = self.signer.keys
        key = (self.version, keys.worker.key_id if keys is not None else "")
        if self._envelope is None or self._envelope[0] != key:
            body = self.trust_bundle().SerializeToString(deterministic=True)
            self._envelope = (key, self.signer.sign_trust_bundle(body))
        return self._envelope[1]


async def register(store: Store, signer: Signer) -> None:
    """Publish the worker certificate to the store, so every gateway can relay it with what it signed."""
    keys = signer.keys
    if keys is None:
        return
    w = keys.worker
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        await signing_sql.put_cert(tx, w.key_id, w.cert_der, int(w.not_after * 1000), now_ms)


async def rotate(
    store: Store,
    bus: Bus | None,
    signer: Signer,
    clock: Clock,
    rng: random.Random,
    secrets: Secrets,
    *,
    issued: tuple[bytes, bytes] | None = None,
) -> tuple[int, int]:
    """A new worker key; re-sign the current specs and the commands that may still be delivered.

    `issued` is a worker key and certificate (PEM) the operator's CLI issued
    with the root kept in a file (`bc pki rotate --root-key`): installed only
    if it chains to this install's root. Returns (specs, commands) re-signed.
    Bodies are never re-encoded: only the signature columns change, so a node
    that already applied a generation sees the same bytes. A UsageError when
    signing is off, or with no `issued` when the root key is not on this host.
    """
    old = signer.keys.worker.key_id if signer.keys is not None else ""
    if issued is not None:
        w = signer.install_worker(issued[0], issued[1], await store.now_ms() / 1000)
    else:
        w = signer.rotate_worker(clock, rng, secrets)
    await register(store, signer)
    specs = cmds = 0
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        for r in await signing_sql.specs_to_resign(tx, w.key_id):
            sig = signer.sign_spec(bytes(r["spec_body"]))
            if await signing_sql.resign_spec(tx, str(r["node_id"]), int(r["generation"]), sig.signature, sig.key_id):
                specs += 1
        for r in await signing_sql.commands_to_resign(tx, w.key_id):
            sig = signer.sign_command(bytes(r["body"]))
            await signing_sql.resign_command(tx, str(r["id"]), sig.signature, sig.key_id)
            cmds += 1
        await publish(
            tx,
            bus,
            "pki.worker-rotated",
            w.key_id,
            {"previous_key_id": old, "resigned_specs": specs, "resigned_commands": cmds},
            now_ms,
        )
    log.info("event=pki.worker-rotated key_id=%s specs=%d commands=%d", w.key_id, specs, cmds)
    return specs, cmds
