"""The agent's Renewer on the loop clock, against a fake Join.Renew backed by a real CA; and the key/cert crash rule."""

from __future__ import annotations

import asyncio
import base64
import itertools
import logging
import random
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography import x509

from agent.identity import Identity, replace_key_pair
from agent.key_holder import FileNodeKey
from agent.renewal import Renewer, renew_at
from agent.tpm import CLEARED as TPM_CLEARED
from agent.tpm import UNAVAILABLE as TPM_UNAVAILABLE
from agent.tpm import TpmUnavailable
from bc.errors import BcError, ProtocolError, RejoinTooLate, Unauthenticated, Unavailable
from bc.pki import keys
from bc.pki.ca import CertificateAuthority
from bc.pki.identity import make_csr
from bc.pki.rejoin import verify_rejoin_proof
from bc.pki.renewal import check_proof_timestamp, verify_renew_proof
from bc.pki.secrets_source import SystemSecrets
from bc.protocol.pb import common_pb2, join_pb2
from bc.runtime.files import atomic_write
from bc.seams.clock import LoopClock
from bc.testing import advance

RNG = random.Random(1)  # ids and serials, as the one seeded Random of a process would give them
SECRETS = SystemSecrets()

TTL_S = 3600


class Node:
    """A node's data dir as `bc join` leaves it, and a CA playing the server."""

    def __init__(self, root: Path, clock: LoopClock, ttl_s: int = TTL_S, idgen: int = 1) -> None:
        self.dir = root / "node"
        self.clock = clock
        self.ca = CertificateAuthority.create(clock, RNG, SECRETS)
        self.ttl_s = ttl_s
        self.calls: list[float] = []
        self.fail_with: Exception | None = None
        self.rejoin_calls: list[float] = []
        self.rejoin_fails_with: list[BcError] = []  # taken one per call; empty: the re-join succeeds
        key = keys.generate_key()
        cert = self.ca.issue_node_cert(make_csr(key, "n1"), "n1", "node", idgen, ttl_s)
        self.dir.mkdir()
        keys.write_private_key(self.dir / "node.key", key)
        atomic_write(self.dir / "node.crt", keys.cert_to_pem(cert))
        atomic_write(self.dir / "ca.crt", self.ca.ca_pem)
        Identity("n1", "node", "127.0.0.1:1", idgen, self.ca.fingerprint).save(self.dir)
        self.identity = Identity.load(self.dir)

    def cert(self) -> x509.Certificate:
        return keys.load_cert_pem((self.dir / "node.crt").read_bytes())

    def key_pem(self) -> bytes:
        return (self.dir / "node.key").read_bytes()

    async def renew_rpc(self, req: join_pb2.RenewRequest, key_pem: bytes, cert_pem: bytes) -> join_pb2.RenewResponse:
        """What the server checks of the proof, then a certificate for the CSR's key."""
        self.calls.append(self.clock.now())
        if self.fail_with is not None:
            raise self.fail_with
        current = keys.load_cert_pem(cert_pem)
        assert current.public_key() == keys.load_key_pem(key_pem).public_key()
        verify_renew_proof(current, req.csr_der, req.timestamp_ms, req.proof, now_ms=round(self.clock.now() * 1000))
        csr = x509.load_der_x509_csr(req.csr_der)
        new = self.ca.issue_node_cert(csr, "n1", "node", self.identity.identity_generation, self.ttl_s)
        return join_pb2.RenewResponse(
            cert_pem=keys.cert_to_pem(new), trust=common_pb2.TrustBundle(ca_pem=self.ca.ca_pem, quorum_k=2)
        )

    async def rejoin_rpc(self, req: join_pb2.RejoinRequest) -> join_pb2.RenewResponse:
        """What the server checks of a re-join's proof, then a certificate for the CSR's key."""
        self.rejoin_calls.append(self.clock.now())
        if self.rejoin_fails_with:
            raise self.rejoin_fails_with.pop(0)
        expired = x509.load_der_x509_certificate(req.cert_der)
        assert expired.serial_number == self.cert().serial_number, "the re-join presents the node's last certificate"
        verify_rejoin_proof(expired, req.cert_der, req.csr_der, req.timestamp_ms, req.nonce, req.proof)
        check_proof_timestamp(req.timestamp_ms, round(self.clock.now() * 1000))
        csr = x509.load_der_x509_csr(req.csr_der)
        new = self.ca.issue_node_cert(csr, "n1", "node", self.identity.identity_generation, self.ttl_s)
        return join_pb2.RenewResponse(cert_pem=keys.cert_to_pem(new))

    def renewer(self, on_renewed: Callable[[], None] | None = None) -> Renewer:
        return Renewer(
            self.dir,
            self.identity,
            self.clock,
            random.Random(5),
            on_renewed=on_renewed,
            call=self.renew_rpc,
            rejoin_call=self.rejoin_rpc,
        )


@pytest.fixture
def node(tmp_path: Path, clock: LoopClock) -> Node:
    return Node(tmp_path, clock)


async def test_one_renewal_rotates_the_key_and_stores_the_certificate_and_trust(node: Node) -> None:
    old_cert, old_key = node.cert(), node.key_pem()
    renewed: list[int] = []
    new = await node.renewer(on_renewed=lambda: renewed.append(1)).renew_once()
    assert renewed == [1]
    assert node.cert().serial_number == new.serial_number != old_cert.serial_number
    assert node.key_pem() != old_key
    assert node.cert().public_key() == keys.load_key_pem(node.key_pem()).public_key()
    assert (node.dir / "node.key").stat().st_mode & 0o777 == 0o600
    assert not list(node.dir.glob("*.next"))
    stored = common_pb2.TrustBundle.FromString(base64.b64decode(Identity.load(node.dir).trust_bundle_b64))
    assert stored.ca_pem == node.ca.ca_pem and stored.quorum_k == 2


async def test_an_empty_trust_bundle_keeps_the_stored_one(node: Node) -> None:
    node.identity.set_trust_bundle(common_pb2.TrustBundle(ca_pem=b"kept"))
    renewer = node.renewer()
    assert not renewer._store_trust(join_pb2.RenewResponse(cert_pem=b"x"))
    assert node.identity.trust_bundle().ca_pem == b"kept"


async def test_an_unsigned_bundle_cannot_replace_one_that_holds_roots(node: Node) -> None:
    node.identity.set_trust_bundle(common_pb2.TrustBundle(ca_pem=b"kept", command_signing_roots=[b"root"]))
    renewer = node.renewer()
    stripped = join_pb2.RenewResponse(cert_pem=b"x", trust=common_pb2.TrustBundle(ca_pem=b"kept"))
    assert not renewer._store_trust(stripped)
    assert list(node.identity.trust_bundle().command_signing_roots) == [b"root"]


async def test_a_certificate_for_another_key_is_not_stored(node: Node) -> None:
    before = (node.cert().serial_number, node.key_pem())

    async def wrong_key(req: join_pb2.RenewRequest, key_pem: bytes, cert_pem: bytes) -> join_pb2.RenewResponse:
        other = node.ca.issue_node_cert(make_csr(keys.generate_key(), "n1"), "n1", "node", 1, TTL_S)
        return join_pb2.RenewResponse(cert_pem=keys.cert_to_pem(other))

    renewer = Renewer(node.dir, node.identity, node.clock, random.Random(1), call=wrong_key)
    with pytest.raises(ProtocolError, match="not for the key"):
        await renewer.renew_once()
    assert (node.cert().serial_number, node.key_pem()) == before


async def test_renews_at_60_percent_of_each_certificates_life(node: Node, clock: LoopClock) -> None:
    first = node.cert()
    done = asyncio.Event()
    renewer = node.renewer(on_renewed=lambda: done.set() if len(node.calls) == 2 else None)
    task = asyncio.create_task(renewer.run())
    await asyncio.wait_for(done.wait(), 2 * TTL_S)  # virtual seconds: both renewals fall within two lifetimes
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    due = renew_at(first.not_valid_before_utc.timestamp(), first.not_valid_after_utc.timestamp())
    assert node.calls[0] == pytest.approx(due, abs=0.01)
    assert node.calls[1] == pytest.approx(due + 0.6 * TTL_S, abs=0.01)  # the second certificate, issued at `due`


async def test_the_proof_uses_server_time(node: Node, clock: LoopClock) -> None:
    # The node's clock is 5 minutes behind the server's; the Welcome offset corrects the proof's time.
    clock_behind = clock.shifted(-300)
    renewer = Renewer(
        node.dir, node.identity, clock_behind, random.Random(1), call=node.renew_rpc, server_offset_ms=lambda: 300_000
    )
    await renewer.renew_once()  # the fake server checks the timestamp against its own (the test's) clock


TOO_LATE = RejoinTooLate("certificate 1 of node n1 expired more than 7 days ago; join again: bc join --reset --yes")


async def test_failures_back_off_then_rejoin_at_expiry_and_stop_when_refused(
    node: Node, clock: LoopClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent.renewal")
    node.fail_with = Unavailable("cannot reach bc serve at 127.0.0.1:1: connection refused")
    node.rejoin_fails_with = [TOO_LATE]
    cert = node.cert()
    not_after = cert.not_valid_after_utc.timestamp()
    await asyncio.wait_for(node.renewer().run(), 2 * TTL_S)  # returns by itself: the re-join was refused
    assert all(t < not_after for t in node.calls)
    gaps = [b - a for a, b in itertools.pairwise(node.calls)]
    assert gaps[0] == pytest.approx(30, abs=0.01) and all(30 <= g <= 600 for g in gaps[:-1]) and gaps[-1] <= 600
    failed = [r.getMessage() for r in caplog.records if "event=renewal.failed" in r.getMessage()]
    assert len(failed) == len(node.calls)
    assert failed[0].startswith("event=renewal.failed attempt=1 expires_in_s=")
    assert "connection refused" in failed[0]
    assert f"attempt={len(node.calls)} " in failed[-1]
    # At the expiry the renewer re-joins once; the server's refusal is final and its sentence is logged.
    assert len(node.rejoin_calls) == 1 and node.rejoin_calls[0] >= not_after
    impossible = [r.getMessage() for r in caplog.records if "event=renewal.impossible" in r.getMessage()]
    assert len(impossible) == 1 and TOO_LATE.message in impossible[0]
    assert node.cert().serial_number == cert.serial_number


async def test_an_expired_certificate_rejoins_with_its_key_on_start(
    node: Node, clock: LoopClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent.renewal")
    old = node.cert()
    await advance(TTL_S + 3600)  # the host was off for an hour past the expiry
    done = asyncio.Event()
    renewer = node.renewer(on_renewed=done.set)
    task = asyncio.create_task(renewer.run())
    await asyncio.wait_for(done.wait(), 10)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert node.calls == [], "an expired certificate is never sent to Renew"
    assert renewer.rejoins == 1 and renewer.renewals == 0
    new = node.cert()
    assert new.serial_number != old.serial_number and new.not_valid_after_utc > old.not_valid_after_utc
    assert new.public_key() == keys.load_key_pem(node.key_pem()).public_key() != old.public_key()
    assert any("event=renewal.succeeded via=rejoin" in r.getMessage() for r in caplog.records)


async def test_an_unreachable_server_is_retried_until_the_rejoin_works(
    node: Node, clock: LoopClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent.renewal")
    await advance(TTL_S + 1)
    node.rejoin_fails_with = [Unavailable("down"), Unavailable("down"), Unavailable("down")]
    done = asyncio.Event()
    renewer = node.renewer(on_renewed=done.set)
    task = asyncio.create_task(renewer.run())
    await asyncio.wait_for(done.wait(), 3600)  # virtual seconds: three back-offs of at most 2 min
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    gaps = [b - a for a, b in itertools.pairwise(node.rejoin_calls)]
    assert len(node.rejoin_calls) == 4 and all(30 <= g <= 600 for g in gaps)
    failed = [r.getMessage() for r in caplog.records if "via=rejoin error=down" in r.getMessage()]
    assert len(failed) == 3 and failed[2].startswith("event=renewal.failed attempt=3 expired_for_s=")
    assert renewer.rejoins == 1


async def test_a_failure_then_a_success_starts_the_schedule_over(node: Node, clock: LoopClock) -> None:
    node.fail_with = Unavailable("down")
    done = asyncio.Event()

    def renewed() -> None:
        done.set()

    renewer = node.renewer(on_renewed=renewed)
    task = asyncio.create_task(renewer.run())
    while len(node.calls) < 2:
        await advance(1)
    node.fail_with = None
    await asyncio.wait_for(done.wait(), TTL_S)  # the next try, after at most one back-off
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert renewer.renewals == 1


# -- the crash rule for node.key / node.crt --------------------------------------------------------


def _new_pair(node: Node, idgen: int = 1) -> tuple[bytes, bytes]:
    key = keys.generate_key()
    cert = node.ca.issue_node_cert(make_csr(key, "n1"), "n1", "node", idgen, TTL_S)
    return keys.key_to_pem(key), keys.cert_to_pem(cert)


def _pair_matches(d: Path) -> bool:
    cert = keys.load_cert_pem((d / "node.crt").read_bytes())
    return cert.public_key() == keys.load_key_pem((d / "node.key").read_bytes()).public_key()


def test_a_crash_before_the_new_certificate_is_written_keeps_the_old_pair(node: Node) -> None:
    old = (node.key_pem(), (node.dir / "node.crt").read_bytes())
    key_pem, _ = _new_pair(node)
    atomic_write(node.dir / "node.key.next", key_pem, 0o600)  # crash here
    Identity.load(node.dir)
    assert (node.key_pem(), (node.dir / "node.crt").read_bytes()) == old
    assert not list(node.dir.glob("*.next"))


def test_a_crash_with_both_new_files_written_finishes_the_replacement(node: Node) -> None:
    key_pem, cert_pem = _new_pair(node)
    atomic_write(node.dir / "node.key.next", key_pem, 0o600)
    atomic_write(node.dir / "node.crt.next", cert_pem)  # crash here
    Identity.load(node.dir)
    assert (node.key_pem(), (node.dir / "node.crt").read_bytes()) == (key_pem, cert_pem)
    assert (node.dir / "node.key").stat().st_mode & 0o777 == 0o600
    assert not list(node.dir.glob("*.next"))


def test_a_crash_between_the_two_renames_finishes_the_replacement(node: Node) -> None:
    key_pem, cert_pem = _new_pair(node)
    atomic_write(node.dir / "node.key.next", key_pem, 0o600)
    atomic_write(node.dir / "node.crt.next", cert_pem)
    (node.dir / "node.key.next").rename(node.dir / "node.key")  # crash here: new key, old certificate
    assert not _pair_matches(node.dir)
    Identity.load(node.dir)
    assert _pair_matches(node.dir) and (node.dir / "node.crt").read_bytes() == cert_pem


def test_leftovers_of_an_older_identity_are_discarded(node: Node) -> None:
    old = (node.key_pem(), (node.dir / "node.crt").read_bytes())
    key_pem, cert_pem = _new_pair(node, idgen=7)  # e.g. left behind before a `bc join --reset`
    atomic_write(node.dir / "node.key.next", key_pem, 0o600)
    atomic_write(node.dir / "node.crt.next", cert_pem)
    Identity.load(node.dir)
    assert (node.key_pem(), (node.dir / "node.crt").read_bytes()) == old
    assert not list(node.dir.glob("*.next"))


def test_a_complete_replacement_leaves_nothing_pending(node: Node) -> None:
    key_pem, cert_pem = _new_pair(node)
    replace_key_pair(node.dir, node.identity, key_pem, cert_pem)
    assert _pair_matches(node.dir) and not list(node.dir.glob("*.next"))


# -- a node key that lives elsewhere (agent.key_holder): the TPM's failure modes as the renewer meets them --


class FlakyHolder(FileNodeKey):
    """The node's file key behind a holder that fails its checks as a TPM would, `failures` times."""

    def __init__(self, path: Path, failures: list[BcError]) -> None:
        super().__init__(path)
        self.failures = failures
        self.checks = 0

    async def check(self, cert: x509.Certificate) -> None:
        self.checks += 1
        if self.failures:
            raise self.failures.pop(0)
        await super().check(cert)


async def test_an_unreachable_tpm_fails_the_renewal_loudly_and_is_retried_with_back_off(
    node: Node, clock: LoopClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent.renewal")
    holder = FlakyHolder(node.dir / "node.key", [TpmUnavailable(f"{TPM_UNAVAILABLE} (device:/dev/tpmrm0: gone)")] * 2)
    done = asyncio.Event()
    renewer = Renewer(
        node.dir, node.identity, clock, random.Random(5), on_renewed=done.set, call=node.renew_rpc, key_holder=holder
    )
    task = asyncio.create_task(renewer.run())
    await asyncio.wait_for(done.wait(), TTL_S)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    failed = [r.getMessage() for r in caplog.records if "event=renewal.failed" in r.getMessage()]
    assert len(failed) == 2 and all(TPM_UNAVAILABLE in f for f in failed)
    assert len(node.calls) == 1, "no request leaves the node while its key cannot be reached"
    assert holder.checks == 3 and renewer.renewals == 1


async def test_a_cleared_tpm_stops_the_rejoin_with_its_sentence_and_sends_nothing(
    node: Node, clock: LoopClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent.renewal")
    await advance(TTL_S + 1)
    holder = FlakyHolder(node.dir / "node.key", [Unauthenticated(TPM_CLEARED)])
    renewer = Renewer(
        node.dir, node.identity, clock, random.Random(5), call=node.renew_rpc, rejoin_call=node.rejoin_rpc,
        key_holder=holder,
    )  # fmt: skip
    await asyncio.wait_for(renewer.run(), 10)
    assert node.calls == [] and node.rejoin_calls == []
    impossible = [r.getMessage() for r in caplog.records if "event=renewal.impossible" in r.getMessage()]
    assert len(impossible) == 1 and impossible[0].endswith(TPM_CLEARED)
