"""A TPM identity's session key: made in memory, certified by `Join.SessionCert` with a proof of the TPM key.

grpcio's TLS takes a client key only as PEM bytes, and the key of a node joined with `--attestor tpm` never
leaves its TPM. So the session's mutual TLS runs on a **session key** instead (`bc.pki.session_cert`):

* at start, and at 60 % of the current session certificate's life (`agent.renewal.renew_at`), `SessionKeys`
  makes a P-256 key in memory (it is never written anywhere), signs with the TPM key (`NodeKeyHolder.sign`,
  tpm2-tools) a request naming the node, its certificate's serial, the session key's CSR, the time and 16
  fresh bytes, and calls `Join.SessionCert` under a leaf of the install's join root, which proves nothing;
* the server answers with a session certificate: the node's names plus `urn:bc:session-of:<serial>`, for the
  lesser of 24 h and what the node certificate has left. It is checked here (this key, this node, this
  identity generation, this CA, of this node certificate) and then held, with its key, in memory only;
* every new pair calls `on_new` (the agent rotates its session onto it); `wake()` asks for a new pair now
  (the node certificate was renewed: the next session certificate is of the new one).

What goes wrong, and what the keeper does:

* a retry can help (the server unreachable, the TPM busy: `Unavailable`; the server's "retry" refusals, which
  come as `Conflict`: the node certificate is not the latest, has expired, or the node's clock is off):
  retried without end, with a renewal's back-off (30 s doubling to 10 min) while the session certificate held
  is still good, else with the dial's (full jitter, 1 s doubling to 60 s: there is no session without one);
  a `Conflict` also calls `on_stale`, which wakes the renewer (the node certificate it holds needs renewing
  or re-joining before anything else);
* the TPM no longer holds the key, or is another TPM (`Unauthenticated` from the holder's check), or the
  server refuses for good (revoked, an older identity, a certificate it does not know: `Unauthenticated`):
  `run` returns the refusal, and the agent stops with its sentence.

One change of identity at a time: `identity_lock` is held while a session certificate is asked for, and the
renewer holds the same lock through a renewal or a re-join (`Renewer(identity_lock=…)`), from reading
node.crt to installing its successor. Both fall due at the same time on a node started just after its join
(a session certificate ends when its node certificate does), and without the lock the request would present
a node certificate the server had just replaced (`not-latest`), or one whose key the TPM holder had not
taken up yet.

Times are server times (the local clock plus the Welcome's offset), as the renewer's: the server judges the
proof's timestamp and dated the certificate by its own clock.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from agent.identity import Identity
from agent.key_holder import NodeKeyHolder
from agent.renewal import WAKE_CHECK_S, renew_at, retry_delay
from agent.session.dialing import backoff_delay
from bc.errors import BcError, Conflict, ProtocolError, Unauthenticated, Unavailable
from bc.pki import keys, tokens
from bc.pki.identity import make_csr, peer_identity
from bc.pki.secrets_source import Secrets, SystemSecrets
from bc.pki.session_cert import NONCE_BYTES, session_of, session_proof_message
from bc.protocol.pb import join_pb2
from bc.runtime.aio import wait_event
from bc.seams.clock import Clock
from bc.wire.status import status_to_error
from bc.wire.stubs import join_pb2_grpc
from bc.wire.tls import channel_credentials

log = logging.getLogger("agent.session_key")

RPC_TIMEOUT_S = 20.0

SessionCertCall = Callable[[join_pb2.SessionCertRequest], Awaitable[join_pb2.SessionCertResponse]]


@dataclass(frozen=True)
class SessionPair:
    """A session key and its certificate, in memory only."""

    key: ec.EllipticCurvePrivateKey
    key_pem: bytes
    cert_pem: bytes
    cert: x509.Certificate

    @property
    def serial(self) -> str:
        return format(self.cert.serial_number, "x")


@dataclass(frozen=True)
class SessionKeysEnd:
    """Why the keeper stopped: the refusal's error, and whether the server said it (else the TPM did)."""

    error: BcError
    by_server: bool


class ServerRefused(Unauthenticated):
    """`Join.SessionCert` refused for good (as opposed to the TPM, whose refusals are `Unauthenticated` too)."""


class SessionKeys:
    """Keeps a certified session key in memory for a TPM identity, until cancelled or refused for good."""

    def __init__(
        self,
        data_dir: Path,
        identity: Identity,
        holder: NodeKeyHolder,
        clock: Clock,
        rng: random.Random,
        *,
        server_offset_ms: Callable[[], int] | None = None,
        call: SessionCertCall | None = None,
        secrets: Secrets | None = None,
        on_new: Callable[[], None] | None = None,
        on_stale: Callable[[], None] | None = None,
    ) -> None:
        """`rng`: the back-off's jitter (the agent's one Random); `secrets`: the nonce (the OS's by default)."""
        self.data_dir, self.identity, self.holder = data_dir, identity, holder
        self.clock, self.rng = clock, rng
        self.server_offset_ms: Callable[[], int] = server_offset_ms or (lambda: 0)
        self._call: SessionCertCall = call or self._grpc_session_cert
        self._secrets: Secrets = secrets or SystemSecrets()
        self.on_new, self.on_stale = on_new, on_stale
        self.current: SessionPair | None = None
        self.issued = 0  # session certificates obtained by this process
        self.identity_lock = asyncio.Lock()  # shared with the renewer: one change of identity at a time
        self._wake = asyncio.Event()

    # -- what the dial and the signer read -----------------------------------------------------------------

    def key(self) -> ec.EllipticCurvePrivateKey | None:
        """The certified session key, or None before the first certificate."""
        return self.current.key if self.current is not None else None

    def pair(self) -> tuple[bytes, bytes] | None:
        """(key PEM, certificate PEM) for TLS, or None before the first certificate."""
        return (self.current.key_pem, self.current.cert_pem) if self.current is not None else None

    def wake(self) -> None:
        """Ask for a new session certificate now (the node certificate was renewed, or re-joined)."""
        self._wake.set()

    def now(self) -> float:
        return self.clock.now() + self.server_offset_ms() / 1000.0

    # -- the loop --------------------------------------------------------------------------------------------

    async def run(self) -> SessionKeysEnd:
        """Obtain a session certificate now and again at 60 % of each one's life; retry what a retry can help.
        Returns only on a refusal no retry can help."""
        attempt = 0
        while True:
            self._wake.clear()
            try:
                await self.obtain_once()
                attempt = 0
            except asyncio.CancelledError:
                raise
            except ServerRefused as r:
                self._impossible(r)
                return SessionKeysEnd(r, by_server=True)
            except Unauthenticated as e:  # the TPM lost the key, or is another one: no retry helps
                self._impossible(e)
                return SessionKeysEnd(e, by_server=False)
            except Exception as e:  # the server unreachable, the TPM busy, a "retry" refusal: back off
                attempt += 1
                log.warning("event=session-cert.failed attempt=%d error=%s", attempt, _describe(e))
                if isinstance(e, Conflict) and self.on_stale is not None:
                    self.on_stale()  # the node certificate must be renewed or re-joined first
                await wait_event(self._wake, self._retry_delay(attempt))
                continue
            assert self.current is not None
            cert = self.current.cert
            await self._sleep_until(
                renew_at(cert.not_valid_before_utc.timestamp(), cert.not_valid_after_utc.timestamp())
            )

    def _retry_delay(self, attempt: int) -> float:
        """While a session certificate is still good, a renewal's back-off (30 s to 10 min); without one the node
        has no session at all, and retries as its dial does (full jitter, 1 s doubling to 60 s)."""
        cur = self.current
        if cur is not None and self.now() < cur.cert.not_valid_after_utc.timestamp():
            return retry_delay(attempt, self.rng)
        return backoff_delay(attempt, self.rng)

    async def _sleep_until(self, at: float) -> None:
        """Until `at` (server time) or a `wake()`; long sleeps re-read the clock (a suspended host)."""
        while (left := at - self.now()) > 0:
            if await wait_event(self._wake, min(left, WAKE_CHECK_S)):
                return

    async def obtain_once(self) -> SessionPair:
        """One session certificate: a new key, the TPM's proof, `Join.SessionCert`, the answer checked, held."""
        async with self.identity_lock:
            pair = await self._obtain()
        if self.on_new is not None:
            self.on_new()
        return pair

    async def _obtain(self) -> SessionPair:
        cert_pem = await asyncio.to_thread(self.identity.read, self.data_dir, "cert")
        node_cert = keys.load_cert_pem(cert_pem)
        await self.holder.check(node_cert)  # a cleared TPM says so before any request
        key = keys.generate_key()
        csr_der = make_csr(key, self.identity.node_id).public_bytes(serialization.Encoding.DER)
        cert_der = node_cert.public_bytes(serialization.Encoding.DER)
        serial = format(node_cert.serial_number, "x")
        timestamp_ms = round(self.now() * 1000)
        nonce = self._secrets.token_bytes(NONCE_BYTES)
        message = session_proof_message(self.identity.node_id, serial, cert_der, csr_der, timestamp_ms, nonce)
        request = join_pb2.SessionCertRequest(
            cert_der=cert_der,
            csr_der=csr_der,
            timestamp_ms=timestamp_ms,
            nonce=nonce,
            proof=await self.holder.sign(message),
        )
        try:
            response = await self._call(request)
        except Unauthenticated as e:
            raise ServerRefused(e.message) from None
        ca_pem = await asyncio.to_thread(self.identity.read, self.data_dir, "ca")
        issued = self._check_issued(response.cert_pem, key.public_key(), serial, ca_pem)
        self.current = SessionPair(key, keys.key_to_pem(key), response.cert_pem, issued)
        self.issued += 1
        log.info(
            "event=session-cert.obtained serial=%x session_of=%s not_after=%s",
            issued.serial_number,
            serial,
            issued.not_valid_after_utc.isoformat(),
        )
        return self.current

    def _check_issued(
        self, cert_pem: bytes, key: ec.EllipticCurvePublicKey, serial: str, ca_pem: bytes
    ) -> x509.Certificate:
        """Refuse a session certificate that would not work: another key, node, identity or CA, or of another
        node certificate."""
        cert = keys.load_cert_pem(cert_pem)
        peer = peer_identity(cert, keys.load_cert_pem(ca_pem))
        if cert.public_key() != key:
            raise ProtocolError("the session certificate is not for the session key this node sent")
        if peer.kind != "node" or peer.name != self.identity.node_id:
            raise ProtocolError(f"the session certificate names {peer.kind} {peer.name!r}, not this node")
        if peer.identity_generation != self.identity.identity_generation:
            raise ProtocolError(
                f"the session certificate is for identity generation {peer.identity_generation},"
                f" not {self.identity.identity_generation}"
            )
        if session_of(cert) != serial:
            raise ProtocolError(f"the session certificate is not one of certificate {serial}")
        return cert

    async def _grpc_session_cert(self, request: join_pb2.SessionCertRequest) -> join_pb2.SessionCertResponse:
        """`Join.SessionCert` at each of the node's addresses in turn while they are unavailable."""
        ca_pem = await asyncio.to_thread(self.identity.read, self.data_dir, "ca")
        leaf_key, leaf_cert = tokens.rejoin_client_credentials(
            self.identity.ca_fingerprint, self.identity.node_id, self.clock
        )
        creds = channel_credentials(ca_pem, leaf_key, leaf_cert)
        last: BcError = Unavailable("the node has no server address to ask for a session certificate")
        for address in [a.strip() for a in self.identity.server.split(",") if a.strip()]:
            try:
                async with grpc.aio.secure_channel(address, creds) as channel:
                    response: join_pb2.SessionCertResponse = await join_pb2_grpc.JoinStub(channel).SessionCert(
                        request, timeout=RPC_TIMEOUT_S
                    )
                return response
            except grpc.aio.AioRpcError as e:
                last = status_to_error(e.code(), e.details() or "", server=address)
                if not last.retryable:
                    raise last from None
        raise last

    def _impossible(self, error: BcError) -> None:
        log.error("event=session-cert.impossible: %s", error.message)


def _describe(e: Exception) -> str:
    if isinstance(e, BcError):
        return e.message
    return f"{type(e).__name__}: {e}"
