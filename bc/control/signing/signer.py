"""The Signer: what signs intent on the control plane, passed in wherever intent is written or checked.

`bc serve` builds one Signer at start and hands it to every writer of intent
(the Admin servicer, the Join servicer, the gateway, the workers); nothing
finds it. It used to ride on the bus, where a bare `Bus()` silently meant
"sign nothing and check no attestation": now every function that stores a
command body (`commands.enqueue_in`) or a DesiredState body
(`specs.write_spec`) takes a Signer as a required argument and stores what it
returns in the same statement, so no code path reaches the store around it.

Two implementations:

* `KeySigner(keys)` — command signing on. The worker key signs every command
  body (purpose `command`) and every DesiredState body (`desired-state`); the
  trust bundle is signed by the root key when it is on this host, else by the
  worker (`trust-bundle`, see `bc.control.trust.intent`). `attested` is True: the
  node's own signature is required on the results of attested kinds and on
  allocation reports (`bc.control.signing.attestation`).
* `KeylessSigner()` — a gateway-only process: it holds no key. Whether signing
  (and with it attestation) is on is read from the store (`refresh`: a worker
  certificate is registered). A spec it writes while signing is on is stored
  unsigned and `pending`: a process holding the worker key signs it
  (`bc.control.nodes.spec_signing`) and only then do gateways deliver it. It signs
  no command and no trust bundle: it relays the stored ones.
* `NullSigner()` — command signing off. It returns the documented unsigned
  form, `UNSIGNED = Signature(b"", "")`: the row's `signature` column is NULL
  and its `signer_key_id` empty, and the gateway relays the body in an
  envelope with no signature, key id or certificate chain. The trust bundle
  carries no command-signing roots and has no envelope. `attested` is False.

Signatures are ECDSA or Ed25519 bytes kept in their own columns and frames:
none goes into the events log, so a digest of the log covers no signature.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Protocol

from bc.errors import Unavailable, UsageError
from bc.pki import signing
from bc.pki.secrets_source import Secrets
from bc.pki.signing import SigningKeys, WorkerSigner
from bc.protocol.pb import common_pb2
from bc.seams.clock import Clock
from bc.store import Store
from bc.store import gateway_keys as gk_sql


@dataclass(frozen=True)
class Signature:
    """A signature and the key id of the worker that made it; `UNSIGNED` when signing is off."""

    signature: bytes
    key_id: str
    pending: bool = False  # unsigned for now: a process holding the worker key signs it (KeylessSigner)

    @property
    def stored(self) -> bytes | None:
        """The `signature` column's value: NULL for unsigned."""
        return self.signature or None


UNSIGNED = Signature(b"", "")
PENDING = Signature(b"", "", pending=True)

SIGNING_OFF = "command signing is off on this server; there is no worker key to rotate"


class Signer(Protocol):
    @property
    def keys(self) -> SigningKeys | None:
        """The root certificate and worker key behind the signatures; None when signing is off."""

    @property
    def attested(self) -> bool:
        """Whether the node's own signature is required on attested results and allocation reports."""

    def sign_command(self, body: bytes) -> Signature: ...

    def sign_spec(self, body: bytes) -> Signature: ...

    def sign_trust_bundle(self, body: bytes) -> common_pb2.Envelope | None: ...

    def roots(self) -> list[bytes]:
        """The command-signing roots (PEM) nodes must hold; once they hold one, they refuse anything unsigned."""

    def rotate_worker(self, clock: Clock, rng: random.Random, secrets: Secrets) -> WorkerSigner:
        """A new worker key under the same root; a UsageError when there is none to rotate."""

    def install_worker(self, key_pem: bytes, cert_pem: bytes, now: float) -> WorkerSigner:
        """A worker key issued elsewhere under the root (`bc pki rotate --root-key`); a UsageError unless it is one."""


class KeySigner:
    """Signing on: the worker key signs commands and specs; the root (or the worker) the trust bundle."""

    def __init__(self, keys: SigningKeys) -> None:
        self._keys = keys

    @property
    def keys(self) -> SigningKeys:
        return self._keys

    @property
    def attested(self) -> bool:
        return True

    def _sign(self, purpose: str, body: bytes) -> Signature:
        w = self._keys.worker
        return Signature(w.sign(purpose, body), w.key_id)

    def sign_command(self, body: bytes) -> Signature:
        return self._sign(signing.PURPOSE_COMMAND, body)

    def sign_spec(self, body: bytes) -> Signature:
        return self._sign(signing.PURPOSE_DESIRED_STATE, body)

    def sign_trust_bundle(self, body: bytes) -> common_pb2.Envelope:
        """Nodes take a change of the quorum settings only under the root's own signature (and the approvals
        of the approvers they hold); with the root key offline, the worker's still delivers the bundle."""
        signer = self._keys.root_signer() or self._keys.worker
        return signer.envelope(signing.PURPOSE_TRUST_BUNDLE, body)

    def roots(self) -> list[bytes]:
        return [self._keys.root_pem]

    def rotate_worker(self, clock: Clock, rng: random.Random, secrets: Secrets) -> WorkerSigner:
        return self._keys.rotate_worker(clock, rng, secrets)

    def install_worker(self, key_pem: bytes, cert_pem: bytes, now: float) -> WorkerSigner:
        return self._keys.install_worker(key_pem, cert_pem, now)


class KeylessSigner:
    """No key in this process (a gateway-only `bc serve`): signing on or off as the store says."""

    def __init__(self, signing_on: bool = False) -> None:
        self.signing_on = signing_on

    async def refresh(self, store: Store) -> None:
        """Read whether the install signs (a worker certificate is registered); it never turns off again."""
        async with store.transaction(write=False) as tx:
            self.signing_on = self.signing_on or await gk_sql.signing_on(tx)

    @property
    def keys(self) -> None:
        return None

    @property
    def attested(self) -> bool:
        return self.signing_on

    def sign_command(self, body: bytes) -> Signature:
        if self.signing_on:
            raise Unavailable("this process holds no signing key; commands are queued by the api and workers")
        return UNSIGNED

    def sign_spec(self, body: bytes) -> Signature:
        return PENDING if self.signing_on else UNSIGNED

    def sign_trust_bundle(self, body: bytes) -> None:
        return None

    def roots(self) -> list[bytes]:
        return []

    def rotate_worker(self, clock: Clock, rng: random.Random, secrets: Secrets) -> WorkerSigner:
        raise UsageError("this process holds no signing key; rotate where the root key is kept (bc pki rotate)")

    def install_worker(self, key_pem: bytes, cert_pem: bytes, now: float) -> WorkerSigner:
        raise UsageError("this process holds no signing key; rotate where the root key is kept (bc pki rotate)")


class NullSigner:
    """Signing off: everything comes back in the documented unsigned form, and nothing is attested."""

    @property
    def keys(self) -> None:
        return None

    @property
    def attested(self) -> bool:
        return False

    def sign_command(self, body: bytes) -> Signature:
        return UNSIGNED

    def sign_spec(self, body: bytes) -> Signature:
        return UNSIGNED

    def sign_trust_bundle(self, body: bytes) -> None:
        return None

    def roots(self) -> list[bytes]:
        return []

    def rotate_worker(self, clock: Clock, rng: random.Random, secrets: Secrets) -> WorkerSigner:
        raise UsageError(SIGNING_OFF)

    def install_worker(self, key_pem: bytes, cert_pem: bytes, now: float) -> WorkerSigner:
        raise UsageError(SIGNING_OFF)
