"""The control plane's signing context: what it signs intent with, and what nodes must trust.

With command signing on (the default for a new install), the worker key signs
every command body and every new DesiredState body in the transaction that
stores it, and the trust bundle nodes receive (JoinResponse, Welcome) holds the
command-signing root and is itself signed, so a gateway can neither strip nor
add a root. With it off, nothing is signed and bundles carry no roots.

`attested` follows signing: the node's own signature is then required on the
results of attested kinds and on allocation reports before any state changes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from bc.clock import Clock
from bc.control.bus import Bus
from bc.control.events import publish
from bc.pki import signing
from bc.pki.signing import SigningKeys, WorkerSigner
from bc.protocol.pb import common_pb2
from bc.store import Store
from bc.store import signing as signing_sql

log = logging.getLogger("bc.intent")


@dataclass(frozen=True)
class Signature:
    signature: bytes
    key_id: str


class Intent:
    def __init__(self, keys: SigningKeys | None, ca_pem: bytes) -> None:
        self.keys = keys
        self.ca_pem = ca_pem
        self._bundle_env: common_pb2.Envelope | None = None
        self.quorum = common_pb2.QuorumSettings()  # what nodes hold: approver keys, k, allowance, version
        self.quorum_changes: list[common_pb2.QuorumChange] = []  # the approved path to it (agent.trust walks it)
        self.version = 0  # bumped whenever the bundle nodes should hold changes

    @property
    def approvers(self) -> list[common_pb2.ApproverKey]:
        return list(self.quorum.approver_keys)

    @property
    def enabled(self) -> bool:
        return self.keys is not None

    @property
    def attested(self) -> bool:
        return self.keys is not None

    @property
    def worker(self) -> WorkerSigner | None:
        return self.keys.worker if self.keys else None

    def sign_command(self, body: bytes) -> Signature | None:
        w = self.worker
        return Signature(w.sign(signing.PURPOSE_COMMAND, body), w.key_id) if w else None

    def sign_spec(self, body: bytes) -> Signature | None:
        w = self.worker
        return Signature(w.sign(signing.PURPOSE_DESIRED_STATE, body), w.key_id) if w else None

    def trust_bundle(self) -> common_pb2.TrustBundle:
        b = common_pb2.TrustBundle(ca_pem=self.ca_pem)
        if self.keys is not None:
            b.command_signing_roots.append(self.keys.root_pem)
        q = self.quorum
        b.approver_keys.extend(q.approver_keys)
        b.quorum_k, b.unbatched_destructive_per_hour, b.quorum_version = (
            q.quorum_k,
            q.unbatched_destructive_per_hour,
            q.version,
        )
        b.quorum_changes.extend(self.quorum_changes)
        return b

    async def refresh(self, store: Store) -> bool:
        """Re-read the quorum settings and their changes; True when the bundle changed (gateways then push it)."""
        from bc.control import approvers

        quorum, changes = await approvers.trust_state(store)
        if quorum == self.quorum and changes == self.quorum_changes:
            return False
        self.quorum, self.quorum_changes = quorum, changes
        self._bundle_env = None
        self.version += 1
        return True

    def trust_envelope(self) -> common_pb2.Envelope | None:
        """The bundle, signed by the root key when it is on this host, else by the worker key.

        Nodes take a change of the quorum settings only under the root's own
        signature and the approvals of the approvers they hold
        (`quorum_changes`), so neither a stolen worker key nor the root key
        alone can switch the quorum off. With the root key kept offline, a
        worker-signed bundle still reaches the nodes, and they keep the quorum
        settings they hold.
        """
        if self.keys is None:
            return None
        if self._bundle_env is None:
            signer = self.keys.root_signer() or self.keys.worker
            body = self.trust_bundle().SerializeToString(deterministic=True)
            self._bundle_env = signer.envelope(signing.PURPOSE_TRUST_BUNDLE, body)
        return self._bundle_env

    async def register(self, store: Store) -> None:
        """Publish the worker certificate to the store, so every gateway can relay it with what it signed."""
        w = self.worker
        if w is None:
            return
        now_ms = await store.now_ms()
        async with store.transaction() as tx:
            await signing_sql.put_cert(tx, w.key_id, w.cert_der, int(w.not_after * 1000), now_ms)

    async def rotate(self, store: Store, bus: Bus | None, clock: Clock) -> tuple[int, int]:
        """A new worker key; re-sign the current specs and the commands that may still be delivered.

        Returns (specs, commands) re-signed. Bodies are never re-encoded: only
        the signature columns change, so a node that already applied a
        generation sees the same bytes.
        """
        if self.keys is None:
            from bc.errors import UsageError

            raise UsageError("command signing is off on this server; there is no worker key to rotate")
        old = self.keys.worker.key_id
        w = self.keys.rotate_worker(clock)
        self._bundle_env = None
        await self.register(store)
        specs = cmds = 0
        now_ms = await store.now_ms()
        async with store.transaction() as tx:
            for r in await signing_sql.specs_to_resign(tx, w.key_id):
                sig = w.sign(signing.PURPOSE_DESIRED_STATE, bytes(r["spec_body"]))
                if await signing_sql.resign_spec(tx, str(r["node_id"]), int(r["generation"]), sig, w.key_id):
                    specs += 1
            for r in await signing_sql.commands_to_resign(tx, w.key_id):
                await signing_sql.resign_command(
                    tx, str(r["id"]), w.sign(signing.PURPOSE_COMMAND, bytes(r["body"])), w.key_id
                )
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
