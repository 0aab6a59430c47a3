"""Node certificate renewal: a new key and certificate at about 60 % of the current one's life.

Node certificates last at most 24 h. The `Renewer` sleeps until 60 % of the
current certificate's lifetime has passed (at once if that is already past),
then generates a new P-256 key here (it never leaves the host), sends a CSR
for it with `Join.Renew` over mutual TLS with the *current* key and
certificate, and proves possession of the current key with a signature over
the CSR and the time (`bc.pki.renewal`). On success it replaces node.key and
node.crt together (`agent.identity.replace_key_pair`, which keeps a usable
pair through a crash), stores the trust bundle the server returned and calls
`on_renewed`, which makes the agent redial with the new certificate.

A failed attempt is logged (`event=renewal.failed attempt=N expires_in_s=…`)
and retried after 30 s, doubling to 10 min, jittered; a retry that would
land after the expiry moves to just before it.

An expired certificate cannot be renewed (the TLS handshake itself refuses
it): a node that was offline past its expiry, or whose retries all failed,
re-joins instead (`Join.Rejoin`, `bc.pki.rejoin`): the same new key and CSR,
sent under a join-root leaf with the expired certificate and a proof by its
key, which the server accepts within 7 days of the expiry unless the
certificate was revoked. The agent does this on start too, so a host powered
on after a week-end comes back by itself. Failures that a retry can help
(unreachable, the TPM busy) are retried with the same back-off, without
end; a refusal (revoked, more than 7 days, another identity) is logged as
`event=renewal.impossible` with the server's sentence, which says what the
operator must do (`bc join --reset --yes` with a new token), and the
renewer stops.

A TPM identity (`by_proof`) renews the same way with one difference: its key cannot make a TLS handshake
(grpcio takes a key only as bytes), so `Join.Renew` is called as a re-join is, under a join-root leaf, with
the current certificate and a nonce in the request and a proof that binds them (`bc.pki.renewal`, "by
proof"). `renew_soon()` cuts the wait short: the session keeper (`agent.session_key`) calls it when the
server says the certificate it holds is not the latest, or has expired.

Times: the proof's timestamp and the expiry checks use server time (the
local clock plus the offset the session learned from Welcome), because the
server judges the proof by its own clock and issued the certificate's dates.
The scheduling rules are pure functions below.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from agent.identity import Identity, replace_key_pair
from agent.key_holder import FileNodeKey, NextKey, NodeKeyHolder
from agent.trust import decide_bundle
from bc.errors import BcError, ProtocolError, Unavailable
from bc.pki import keys, tokens
from bc.pki.ca import BACKDATE_S
from bc.pki.identity import peer_identity
from bc.pki.rejoin import NONCE_BYTES, rejoin_proof_message
from bc.pki.renewal import renew_by_proof_message, renew_proof_message
from bc.pki.secrets_source import Secrets, SystemSecrets
from bc.pki.tpm_attest import TpmCertification
from bc.protocol.pb import common_pb2, join_pb2
from bc.runtime.aio import wait_event
from bc.seams.clock import Clock
from bc.wire.status import status_to_error
from bc.wire.stubs import join_pb2_grpc
from bc.wire.tls import channel_credentials

log = logging.getLogger("agent.renewal")

RENEW_AT_FRACTION = 0.6
RETRY_BASE_S = 30.0
RETRY_CAP_S = 600.0
RETRY_JITTER = 0.2  # a retry lands up to 20 % before its doubling, so failed nodes do not retry in step
LAST_TRY_MARGIN_S = 10.0  # the last retry before expiry starts this long before it
WAKE_CHECK_S = 60.0  # long sleeps wake this often to re-read the wall clock (a suspended host misses monotonic time)
RPC_TIMEOUT_S = 20.0

# (request, current key PEM, current certificate PEM) -> response; tests swap the gRPC call out.
RenewCall = Callable[[join_pb2.RenewRequest, bytes, bytes], Awaitable[join_pb2.RenewResponse]]
RejoinCall = Callable[[join_pb2.RejoinRequest], Awaitable[join_pb2.RenewResponse]]


# -- the pure rules ------------------------------------------------------------------------------


def renew_at(not_before: float, not_after: float, backdate_s: float = BACKDATE_S) -> float:
    """When to renew a certificate valid over [not_before, not_after]: 60 % into the lifetime it was given.

    The CA dates every certificate `backdate_s` (60 s) into the past to forgive clock skew, so the
    lifetime starts that much after `not_before` (for a certificate shorter than its backdate, at
    `not_before`). Without this, a short-lived certificate would look 60 % used the moment it arrives.
    """
    issued = not_before + backdate_s if not_after - not_before > backdate_s else not_before
    return issued + RENEW_AT_FRACTION * (not_after - issued)


def retry_delay(attempt: int, rng: random.Random) -> float:
    """The wait after the `attempt`-th failure in a row (1, 2, …): 30 s doubling to 10 min, jittered.

    Jitter takes up to 20 % off the doubling, but never below 30 s: always within [30 s, 10 min].
    """
    nominal = min(RETRY_CAP_S, RETRY_BASE_S * 2.0 ** min(max(attempt, 1) - 1, 16))
    return max(RETRY_BASE_S, nominal * rng.uniform(1.0 - RETRY_JITTER, 1.0))


def next_attempt_at(now: float, attempt: int, not_after: float, rng: random.Random) -> float | None:
    """When to try again after the `attempt`-th failure, or None when no attempt can start before expiry.

    A back-off that would overshoot the expiry is cut to one last try `LAST_TRY_MARGIN_S` before it;
    once even that is past, retrying is pointless (the certificate will be refused at the handshake).
    """
    if now >= not_after:
        return None
    at = now + retry_delay(attempt, rng)
    if at < not_after - LAST_TRY_MARGIN_S:
        return at
    last = not_after - LAST_TRY_MARGIN_S
    return last if last > now else None


# -- the loop ------------------------------------------------------------------------------------


class Renewer:
    """Keeps the node's certificate renewed until it cannot (expired) or the task is cancelled."""

    def __init__(
        self,
        data_dir: Path,
        identity: Identity,
        clock: Clock,
        rng: random.Random,
        *,
        on_renewed: Callable[[], None] | None = None,
        on_trust: Callable[[common_pb2.TrustBundle], None] | None = None,
        server_offset_ms: Callable[[], int] | None = None,
        call: RenewCall | None = None,
        rejoin_call: RejoinCall | None = None,
        key_holder: NodeKeyHolder | None = None,
        secrets: Secrets | None = None,
        by_proof: bool = False,
        identity_lock: asyncio.Lock | None = None,
    ) -> None:
        """`secrets`: where a re-join's nonce comes from (the OS's by default; the simulator's from its seed).
        `by_proof`: renew with the certificate in the request (a TPM identity: its key cannot make a handshake).
        `identity_lock`: held through each renewal and re-join (a TPM identity's session keys share it)."""
        self.data_dir = data_dir
        self._secrets: Secrets = secrets or SystemSecrets()
        self.identity = identity
        self.clock = clock
        self.rng = rng
        self.on_renewed = on_renewed
        self.on_trust = on_trust
        self._offset_ms = server_offset_ms or (lambda: 0)
        self._call: RenewCall = call or self._grpc_renew
        self._rejoin_call: RejoinCall = rejoin_call or self._grpc_rejoin
        # Proofs are signed through the holder (agent.key_holder), whichever attestor the node joined with.
        self.key_holder: NodeKeyHolder = key_holder or FileNodeKey(data_dir / identity.files["key"])
        self.by_proof = by_proof
        self.renewals = 0
        self.rejoins = 0
        self._soon = asyncio.Event()
        self._lock = identity_lock or asyncio.Lock()

    def renew_soon(self) -> None:
        """Renew (or re-join) now rather than at the scheduled time: the server said the certificate is stale."""
        self._soon.set()

    def now(self) -> float:
        """Server time in seconds: the local clock plus the offset from the last Welcome."""
        return self.clock.now() + self._offset_ms() / 1000.0

    async def run(self) -> None:
        """Renew at 60 %, retry failures with back-off, re-join once expired; stop on a refused re-join."""
        attempt = 0
        retry: float | None = None
        while True:
            try:
                cert = await asyncio.to_thread(self._current_cert)
            except (OSError, BcError) as e:  # without node.crt the agent cannot dial either; keep trying
                attempt += 1
                log.error("event=renewal.failed attempt=%d expires_in_s=unknown error=%s", attempt, _describe(e))
                await self.clock.sleep(retry_delay(attempt, self.rng))
                continue
            not_before = cert.not_valid_before_utc.timestamp()
            not_after = cert.not_valid_after_utc.timestamp()
            if self.now() >= not_after:
                if not await self._rejoin_until_done(cert):
                    return
                attempt, retry = 0, None
                continue
            if retry is None:
                at = renew_at(not_before, not_after)
                log.info(
                    "event=renewal.scheduled serial=%x in_s=%.0f expires_in_s=%.0f",
                    cert.serial_number,
                    max(0.0, at - self.now()),
                    not_after - self.now(),
                )
            else:
                at = retry
            await self._sleep_until(at)
            if self.now() >= not_after:
                continue  # slept past the expiry (a suspended host): the top of the loop re-joins
            try:
                await self.renew_once()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # every failure is retried; the log line says what went wrong
                attempt += 1
                now = self.now()
                log.warning(
                    "event=renewal.failed attempt=%d expires_in_s=%.0f error=%s",
                    attempt,
                    not_after - now,
                    _describe(e),
                )
                retry = next_attempt_at(now, attempt, not_after, self.rng)
                if retry is None:
                    # No room for another renewal: sleep until the expiry, where the loop re-joins.
                    retry = not_after
                continue
            attempt, retry = 0, None

    async def _rejoin_until_done(self, cert: x509.Certificate) -> bool:
        """Re-join with the expired `cert`'s key until it works (True) or the server refuses it for good (False).

        Only what a retry can help is retried (`BcError.retryable`, or anything that is not ours, such as
        an OSError): the server's refusal is final and says what to do.
        """
        log.warning(
            "event=renewal.expired serial=%x expired_at=%s: re-joining with the expired certificate's key",
            cert.serial_number,
            cert.not_valid_after_utc.isoformat(),
        )
        attempt = 0
        while True:
            try:
                await self.rejoin_once()
                return True
            except asyncio.CancelledError:
                raise
            except BcError as e:
                if not e.retryable:
                    self._impossible(cert, e.message)
                    return False
                failure: Exception = e
            except Exception as e:  # not ours to judge (a file, the network): retry
                failure = e
            attempt += 1
            log.warning(
                "event=renewal.failed attempt=%d expired_for_s=%.0f via=rejoin error=%s",
                attempt,
                self.now() - cert.not_valid_after_utc.timestamp(),
                _describe(failure),
            )
            await self.clock.sleep(retry_delay(attempt, self.rng))

    async def renew_once(self) -> x509.Certificate:
        """One renewal: new key, CSR, proof, `Join.Renew`, files replaced, trust stored; the new certificate."""
        async with self._lock:
            new_cert = await self._renew()
        self._renewed()
        return new_cert

    async def _renew(self) -> x509.Certificate:
        key_pem, cert_pem = await asyncio.to_thread(self._read_pair)
        cert = keys.load_cert_pem(cert_pem)
        await self.key_holder.check(cert)  # a lost key says why before any request
        nxt = await self.key_holder.next_key(self.identity.node_id)
        timestamp_ms = round(self.now() * 1000)
        if self.by_proof:
            cert_der = cert.public_bytes(serialization.Encoding.DER)
            nonce = self._secrets.token_bytes(NONCE_BYTES)
            message = renew_by_proof_message(cert_der, nxt.csr_der, timestamp_ms, nonce)
            request = join_pb2.RenewRequest(
                csr_der=nxt.csr_der,
                timestamp_ms=timestamp_ms,
                proof=await self.key_holder.sign(message),
                cert_der=cert_der,
                nonce=nonce,
            )
        else:
            request = join_pb2.RenewRequest(
                csr_der=nxt.csr_der,
                timestamp_ms=timestamp_ms,
                proof=await self.key_holder.sign(renew_proof_message(nxt.csr_der, timestamp_ms)),
            )
        if nxt.tpm is not None:
            request.tpm.CopyFrom(_tpm_pb(nxt.tpm))
        response = await self._call(request, key_pem, cert_pem)
        new_cert = await self._install(response, nxt, "renew")
        self.renewals += 1
        return new_cert

    async def rejoin_once(self) -> x509.Certificate:
        """One re-join with the expired certificate's key (`bc.pki.rejoin`): as `renew_once`, by `Join.Rejoin`."""
        async with self._lock:
            new_cert = await self._rejoin()
        self._renewed()
        return new_cert

    def _renewed(self) -> None:
        """A new certificate is in place: what asked for one early is answered, and the agent is told."""
        self._soon.clear()
        if self.on_renewed is not None:
            self.on_renewed()

    async def _rejoin(self) -> x509.Certificate:
        cert_pem = await asyncio.to_thread(self.identity.read, self.data_dir, "cert")
        cert = keys.load_cert_pem(cert_pem)
        await self.key_holder.check(cert)
        cert_der = cert.public_bytes(serialization.Encoding.DER)
        nxt = await self.key_holder.next_key(self.identity.node_id)
        timestamp_ms = round(self.now() * 1000)
        nonce = self._secrets.token_bytes(NONCE_BYTES)
        request = join_pb2.RejoinRequest(
            cert_der=cert_der,
            csr_der=nxt.csr_der,
            timestamp_ms=timestamp_ms,
            nonce=nonce,
            proof=await self.key_holder.sign(rejoin_proof_message(cert_der, nxt.csr_der, timestamp_ms, nonce)),
        )
        if nxt.tpm is not None:
            request.tpm.CopyFrom(_tpm_pb(nxt.tpm))
        response = await self._rejoin_call(request)
        new_cert = await self._install(response, nxt, "rejoin")
        self.rejoins += 1
        return new_cert

    async def _install(self, response: join_pb2.RenewResponse, nxt: NextKey, via: str) -> x509.Certificate:
        """Check the issued certificate, replace the pair on disk, keep the trust bundle, tell the agent."""
        ca_pem = await asyncio.to_thread(self.identity.read, self.data_dir, "ca")
        new_cert = self._check_issued(response.cert_pem, nxt.public_key, ca_pem)
        await asyncio.to_thread(replace_key_pair, self.data_dir, self.identity, nxt.stored, response.cert_pem)
        await self.key_holder.adopt(nxt)
        if self._store_trust(response):
            await asyncio.to_thread(self.identity.save, self.data_dir)
        log.info(
            "event=renewal.succeeded via=%s serial=%x not_after=%s",
            via,
            new_cert.serial_number,
            new_cert.not_valid_after_utc.isoformat(),
        )
        return new_cert

    def _store_trust(self, response: join_pb2.RenewResponse) -> bool:
        """Hold the bundle the server returned, by the same rule as a Welcome's (agent.trust); True if
        identity.json needs saving. An unsigned bundle cannot replace one that holds roots."""
        env = response.trust_envelope if response.HasField("trust_envelope") else None
        ca_pem = self.identity.read(self.data_dir, "ca")
        d = decide_bundle(self.identity.trust_bundle(), env, response.trust, ca_pem, self.now())
        if d.bundle is None:
            if d.reason not in ("unchanged", "no bundle offered"):
                log.warning("event=trust.bundle-refused source=renew reason=%s", d.reason.replace(" ", "-"))
            return False
        self.identity.set_trust_bundle(d.bundle)
        if self.on_trust is not None:
            self.on_trust(d.bundle)
        return True

    def _check_issued(self, cert_pem: bytes, new_key: ec.EllipticCurvePublicKey, ca_pem: bytes) -> x509.Certificate:
        """Refuse to store a certificate that would not work: wrong key, another node, another CA."""
        cert = keys.load_cert_pem(cert_pem)
        peer = peer_identity(cert, keys.load_cert_pem(ca_pem))
        if cert.public_key() != new_key:
            raise ProtocolError("the renewed certificate is not for the key this node sent")
        if peer.kind != "node" or peer.name != self.identity.node_id:
            raise ProtocolError(f"the renewed certificate names {peer.kind} {peer.name!r}, not this node")
        if peer.identity_generation != self.identity.identity_generation:
            raise ProtocolError(
                f"the renewed certificate is for identity generation {peer.identity_generation},"
                f" not {self.identity.identity_generation}"
            )
        return cert

    async def _grpc_renew(
        self, request: join_pb2.RenewRequest, key_pem: bytes, cert_pem: bytes
    ) -> join_pb2.RenewResponse:
        if request.cert_der:  # by proof: called as a re-join is
            return await self._proof_call(request)
        # The call authenticates with the pair the proof was signed with, not whatever is on disk by then.
        ca_pem = await asyncio.to_thread(self.identity.read, self.data_dir, "ca")
        creds = channel_credentials(ca_pem, key_pem, cert_pem)
        try:
            async with grpc.aio.secure_channel(self.identity.server.split(",")[0], creds) as channel:
                response: join_pb2.RenewResponse = await join_pb2_grpc.JoinStub(channel).Renew(
                    request, timeout=RPC_TIMEOUT_S
                )
        except grpc.aio.AioRpcError as e:
            raise status_to_error(e.code(), e.details() or "", server=self.identity.server) from None
        return response

    async def _grpc_rejoin(self, request: join_pb2.RejoinRequest) -> join_pb2.RenewResponse:
        return await self._proof_call(request)

    async def _proof_call(self, request: join_pb2.RejoinRequest | join_pb2.RenewRequest) -> join_pb2.RenewResponse:
        """`Join.Rejoin`, or `Join.Renew` by proof, under a join-root leaf (the request's proof is what counts),
        at each of the node's addresses in turn while they are unavailable."""
        ca_pem = await asyncio.to_thread(self.identity.read, self.data_dir, "ca")
        leaf_key, leaf_cert = tokens.rejoin_client_credentials(
            self.identity.ca_fingerprint, self.identity.node_id, self.clock
        )
        creds = channel_credentials(ca_pem, leaf_key, leaf_cert)
        last: BcError = Unavailable("the node has no server address to call")
        for address in [a for a in self.identity.server.split(",") if a]:
            try:
                async with grpc.aio.secure_channel(address, creds) as channel:
                    stub = join_pb2_grpc.JoinStub(channel)
                    response: join_pb2.RenewResponse
                    if isinstance(request, join_pb2.RejoinRequest):
                        response = await stub.Rejoin(request, timeout=RPC_TIMEOUT_S)
                    else:
                        response = await stub.Renew(request, timeout=RPC_TIMEOUT_S)
                return response
            except grpc.aio.AioRpcError as e:
                last = status_to_error(e.code(), e.details() or "", server=address)
                if not last.retryable:
                    raise last from None
        raise last

    def _read_pair(self) -> tuple[bytes, bytes]:
        return self.identity.read(self.data_dir, "key"), self.identity.read(self.data_dir, "cert")

    def _current_cert(self) -> x509.Certificate:
        return keys.load_cert_pem(self.identity.read(self.data_dir, "cert"))

    async def _sleep_until(self, at: float) -> None:
        while (left := at - self.now()) > 0:
            if await wait_event(self._soon, min(left, WAKE_CHECK_S)):
                self._soon.clear()
                return

    def _impossible(self, cert: x509.Certificate, why: str) -> None:
        log.error(
            "event=renewal.impossible serial=%x expired_at=%s: %s",
            cert.serial_number,
            cert.not_valid_after_utc.isoformat(),
            why,
        )


def _tpm_pb(c: TpmCertification) -> join_pb2.TpmCertification:
    return join_pb2.TpmCertification(
        ak_spki_der=c.ak_spki_der, key_public=c.key_public, attest=c.attest, signature=c.signature
    )


def _describe(e: Exception) -> str:
    if isinstance(e, BcError):
        return e.message
    return f"{type(e).__name__}: {e}"
