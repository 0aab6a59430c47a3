"""A TPM identity's session keys (`agent.session_key`) on the loop clock, against a fake `Join.SessionCert` backed
by a real CA; the dial's in-memory pair; the result signer on the session key.

The node key here is a file key behind the same `NodeKeyHolder` interface: the keeper only asks it to check
the certificate and to sign (tests/integration/test_tpm_swtpm.py runs it on a TPM).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
from pathlib import Path

import pytest
from cryptography import x509

from agent.identity import Identity
from agent.key_holder import FileNodeKey
from agent.node_key import NodeKey
from agent.offload import to_thread
from agent.session.channels import MemoryPair
from agent.session.grpc_dial import GrpcDial
from agent.session_key import SessionKeys
from agent.tpm import CLEARED
from bc.errors import BcError, CertificateRevoked, Conflict, ProtocolError, Unauthenticated, Unavailable
from bc.pki import attest, keys
from bc.pki.ca import CertificateAuthority
from bc.pki.identity import make_csr
from bc.pki.secrets_source import SystemSecrets
from bc.pki.session_cert import (
    SESSION_MAX_TTL_S,
    SESSION_SKEW_MS,
    session_not_after_ms,
    session_of,
    verify_session_proof,
)
from bc.protocol.pb import join_pb2, session_pb2
from bc.runtime.files import atomic_write
from bc.seams.clock import LoopClock
from bc.seams.link import LinkClosed
from bc.testing import advance

RNG = random.Random(1)
NODE_TTL_S = 24 * 3600


class Node:
    """A TPM node's data dir (node.key here a file), and a CA playing `Join.SessionCert`."""

    def __init__(self, root: Path, clock: LoopClock, node_ttl_s: int = NODE_TTL_S) -> None:
        self.dir = root / "node"
        self.clock = clock
        self.ca = CertificateAuthority.create(clock, RNG, SystemSecrets())
        self.calls: list[float] = []
        self.fail_with: list[BcError] = []  # one per call; empty: the call succeeds
        self.answer_for_key: object | None = None  # another key's certificate: a server that answers wrongly
        self.key = keys.generate_key()
        self.cert = self.ca.issue_node_cert(make_csr(self.key, "n1"), "n1", "node", 1, node_ttl_s)
        self.dir.mkdir()
        keys.write_private_key(self.dir / "node.key", self.key)
        atomic_write(self.dir / "node.crt", keys.cert_to_pem(self.cert))
        atomic_write(self.dir / "ca.crt", self.ca.ca_pem)
        Identity("n1", "node", "127.0.0.1:1", 1, self.ca.fingerprint).save(self.dir)
        self.identity = Identity.load(self.dir)
        self.stale = 0
        self.new = 0

    async def session_cert_rpc(self, req: join_pb2.SessionCertRequest) -> join_pb2.SessionCertResponse:
        """What the server checks of the proof and the time, then a session certificate for the CSR's key."""
        self.calls.append(self.clock.now())
        if self.fail_with:
            raise self.fail_with.pop(0)
        presented = x509.load_der_x509_certificate(req.cert_der)
        assert presented.serial_number == self.cert.serial_number, "the request presents the node certificate"
        verify_session_proof(presented, "n1", req.cert_der, req.csr_der, req.timestamp_ms, req.nonce, req.proof)
        now_ms = round(self.clock.now() * 1000)
        assert abs(req.timestamp_ms - now_ms) <= SESSION_SKEW_MS
        csr = x509.load_der_x509_csr(req.csr_der)
        if self.answer_for_key is not None:
            csr = make_csr(keys.generate_key(), "n1")
        end_ms = session_not_after_ms(int(self.cert.not_valid_after_utc.timestamp() * 1000), now_ms)
        serial = format(self.cert.serial_number, "x")
        issued = self.ca.issue_node_cert(
            csr, "n1", "node", 1, SESSION_MAX_TTL_S, session_of=serial, not_after=end_ms / 1000
        )
        return join_pb2.SessionCertResponse(cert_pem=keys.cert_to_pem(issued))

    def keeper(self, holder: FileNodeKey | None = None) -> SessionKeys:
        def stale() -> None:
            self.stale += 1

        def new() -> None:
            self.new += 1

        return SessionKeys(
            self.dir,
            self.identity,
            holder or FileNodeKey(self.dir / "node.key"),
            self.clock,
            random.Random(5),
            call=self.session_cert_rpc,
            on_new=new,
            on_stale=stale,
        )


@pytest.fixture
def node(tmp_path: Path, clock: LoopClock) -> Node:
    return Node(tmp_path, clock)


async def _run_until(keeper: SessionKeys, done: asyncio.Event, timeout: float) -> None:
    task = asyncio.create_task(keeper.run())
    try:
        await asyncio.wait_for(done.wait(), timeout)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_session_key_is_certified_at_start_and_again_at_60_percent_of_each_certificates_life(
    node: Node, clock: LoopClock
) -> None:
    start = clock.now()
    keeper = node.keeper()
    done = asyncio.Event()
    keeper.on_new = lambda: done.set() if keeper.issued == 3 else None
    await _run_until(keeper, done, 2 * NODE_TTL_S)  # virtual seconds
    assert node.calls[0] == pytest.approx(start, abs=0.01), "at start"
    # The first lasts as long as the node certificate (24 h), and is renewed 60 % into its life; the second
    # lasts what the node certificate has left then (9.6 h), and is renewed 60 % into that.
    assert node.calls[1] - node.calls[0] == pytest.approx(0.6 * NODE_TTL_S, abs=1)
    assert node.calls[2] - node.calls[1] == pytest.approx(0.6 * 0.4 * NODE_TTL_S, abs=1)
    assert keeper.current is not None and keeper.pair() == (keeper.current.key_pem, keeper.current.cert_pem)
    assert session_of(keeper.current.cert) == format(node.cert.serial_number, "x")
    assert keeper.current.cert.public_key() == keeper.current.key.public_key()
    # Nothing of it is on disk: the data dir holds what `bc join` wrote and nothing else.
    assert sorted(p.name for p in node.dir.iterdir()) == ["ca.crt", "identity.json", "node.crt", "node.key"]


async def test_a_session_certificate_never_outlives_the_node_certificate(tmp_path: Path, clock: LoopClock) -> None:
    node = Node(tmp_path, clock, node_ttl_s=3600)
    pair = await node.keeper().obtain_once()
    assert pair.cert.not_valid_after_utc <= node.cert.not_valid_after_utc


async def test_without_a_session_certificate_an_unreachable_server_is_retried_as_the_dial_retries(
    node: Node, clock: LoopClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent.session_key")
    node.fail_with = [Unavailable("cannot reach bc serve at 127.0.0.1:1: connection refused")] * 6
    keeper = node.keeper()
    done = asyncio.Event()
    keeper.on_new = done.set
    await _run_until(keeper, done, 3600)
    gaps = [b - a for a, b in itertools.pairwise(node.calls)]
    assert len(node.calls) == 7 and all(g <= 60 for g in gaps), "no session without one: the dial's back-off"
    failed = [r.getMessage() for r in caplog.records if "event=session-cert.failed" in r.getMessage()]
    assert (
        len(failed) == 6
        and "connection refused" in failed[0]
        and failed[5].startswith("event=session-cert.failed attempt=6")
    )


async def test_with_a_good_session_certificate_a_failure_is_retried_as_a_renewal(node: Node, clock: LoopClock) -> None:
    keeper = node.keeper()
    first = asyncio.Event()
    keeper.on_new = first.set
    task = asyncio.create_task(keeper.run())
    await asyncio.wait_for(first.wait(), 10)
    node.fail_with = [Unavailable("down")] * 3
    second = asyncio.Event()
    keeper.on_new = second.set
    await asyncio.wait_for(second.wait(), SESSION_MAX_TTL_S)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    gaps = [b - a for a, b in itertools.pairwise(node.calls[1:])]
    assert len(gaps) == 3 and all(30 <= g <= 600 for g in gaps), gaps


async def test_a_retry_refusal_wakes_the_renewer_and_is_retried(node: Node, clock: LoopClock) -> None:
    node.fail_with = [Conflict("certificate 1 of node n1 is not the node's latest certificate")]
    keeper = node.keeper()
    done = asyncio.Event()
    keeper.on_new = done.set
    await _run_until(keeper, done, 120)
    assert node.stale == 1 and len(node.calls) == 2


@pytest.mark.parametrize(
    "refusal",
    [
        CertificateRevoked("certificate 1 of node n1 was revoked, so it gets no session certificate; join again"),
        Unauthenticated("certificate 1 of node n1 belongs to an older identity of the node; join again"),
    ],
)
async def test_a_final_refusal_ends_the_keeper_with_the_servers_sentence(
    node: Node, clock: LoopClock, refusal: BcError, caplog: pytest.LogCaptureFixture
) -> None:
    node.fail_with = [refusal]
    end = await asyncio.wait_for(node.keeper().run(), 10)
    assert end.by_server and end.error.message == refusal.message
    assert len(node.calls) == 1
    assert any(f"event=session-cert.impossible: {refusal.message}" in r.getMessage() for r in caplog.records)


async def test_a_cleared_tpm_ends_the_keeper_before_it_asks(node: Node, clock: LoopClock) -> None:
    class Cleared(FileNodeKey):
        async def check(self, cert: x509.Certificate) -> None:
            raise Unauthenticated(CLEARED)

    end = await asyncio.wait_for(node.keeper(Cleared(node.dir / "node.key")).run(), 10)
    assert not end.by_server and end.error.message == CLEARED
    assert node.calls == []


async def test_an_answer_for_another_key_is_not_held(node: Node, clock: LoopClock) -> None:
    node.answer_for_key = True
    keeper = node.keeper()
    with pytest.raises(ProtocolError, match="not for the session key this node sent"):
        await keeper.obtain_once()
    assert keeper.current is None and keeper.pair() is None and node.new == 0


async def test_wake_asks_for_a_new_session_certificate_now(node: Node, clock: LoopClock) -> None:
    keeper = node.keeper()
    first = asyncio.Event()
    keeper.on_new = first.set
    task = asyncio.create_task(keeper.run())
    await asyncio.wait_for(first.wait(), 10)
    await advance(3600)
    second = asyncio.Event()
    keeper.on_new = second.set
    keeper.wake()  # the node certificate was renewed
    await asyncio.wait_for(second.wait(), 1)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert node.calls[1] - node.calls[0] == pytest.approx(3600, abs=0.01)


# -- what the rest of the agent reads --------------------------------------------------------------------------


async def test_the_dial_waits_for_a_session_certificate_and_takes_each_new_one(node: Node, clock: LoopClock) -> None:
    keeper = node.keeper()
    pair = MemoryPair(keeper.pair)
    dial = GrpcDial(node.dir, node.identity, node.ca.ca_pem, to_thread, random.Random(1), pair)
    with pytest.raises(LinkClosed) as ei:
        await dial()
    assert ei.value.code == "UNAVAILABLE" and "no session certificate yet" in ei.value.details
    await keeper.obtain_once()
    assert pair.changed() == keeper.pair() and pair.changed() is None, "a pair is taken once"
    await keeper.obtain_once()
    assert pair.changed() == keeper.pair()
    await dial.aclose()


async def test_results_are_signed_with_the_certified_session_key_once_there_is_one(
    node: Node, clock: LoopClock
) -> None:
    keeper = node.keeper()
    signer = NodeKey(None, source=keeper.key)
    update = session_pb2.CommandUpdate(command_id="c1", state=session_pb2.COMMAND_SUCCEEDED, result=b"ok")
    assert not signer.attest_update(update).node_sig, "no key yet: unsigned, signed when a session sends it"
    pair = await keeper.obtain_once()
    signed = signer.attest_update(update)
    message = attest.result_message("c1", "COMMAND_SUCCEEDED", b"ok")
    assert attest.verify(pair.cert.public_key(), message, signed.node_sig)  # type: ignore[arg-type]


async def test_a_session_certificate_is_not_asked_for_while_the_identity_changes(node: Node, clock: LoopClock) -> None:
    """The renewer holds the identity lock from reading node.crt to installing its successor: a request made
    meanwhile would present a certificate the server has just replaced."""
    keeper = node.keeper()
    async with keeper.identity_lock:  # a renewal in flight
        task = asyncio.create_task(keeper.obtain_once())
        await advance(30)
        assert node.calls == [] and not task.done()
    await asyncio.wait_for(task, 1)
    assert len(node.calls) == 1 and keeper.current is not None
