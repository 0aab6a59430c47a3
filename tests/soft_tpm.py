"""A TPM identity whose TPM is played in software (`tests.soft_ak`'s attestation key), for the suites that run
a TPM node's whole path (`Join.SessionCert`, renewal by proof, `bc node`'s session on an in-memory key) over
SQLite and PostgreSQL without a TPM. tests/integration/test_tpm_swtpm.py runs the same agent on a real
(software) TPM through tpm2-tools.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from agent.app import AgentOptions, AgentParts, production_parts
from agent.identity import Identity
from agent.join import split_server
from agent.key_holder import NextKey
from agent.node_key import NodeKey
from agent.offload import to_thread
from agent.session.channels import MemoryPair
from agent.session.grpc_dial import grpc_dial
from agent.session_key import SessionKeys
from agent.tpm import ANOTHER_AK, CLEARED, HANDLES, TpmRecord
from bc.errors import Unauthenticated
from bc.pki import attest, join_answer, keys, tokens
from bc.pki.discovery import fetch_pinned_ca
from bc.pki.identity import make_csr
from bc.pki.tpm_attest import TpmCertification, ak_uri, ak_uri_of, spki
from bc.protocol.pb import join_pb2
from bc.runtime.files import atomic_write
from bc.seams.clock import SystemClock
from bc.wire.stubs import join_pb2_grpc
from bc.wire.tls import channel_credentials
from tests.soft_ak import certify


class SoftTpm:
    """A TPM played in software: an attestation key, and node keys at persistent handles."""

    def __init__(self) -> None:
        self.ak = ec.generate_private_key(ec.SECP256R1())
        self.keys: dict[int, ec.EllipticCurvePrivateKey] = {}
        self.signed = 0  # signatures made with a node key (what the agent asked of its TPM)

    def ak_uri(self) -> str:
        return ak_uri(self.ak.public_key())

    def create(self, handle: int) -> TpmRecord:
        key = ec.generate_private_key(ec.SECP256R1())
        self.keys[handle] = key
        return TpmRecord(handle, spki(key.public_key()).hex(), self.ak_uri())


class SoftTpmKey:
    """`agent.key_holder.NodeKeyHolder` over a `SoftTpm`, as `agent.tpm.TpmNodeKey` is over a TPM: node.key
    holds the same record (the handle, the public key, the AK), never the key."""

    def __init__(self, tpm: SoftTpm, record: TpmRecord) -> None:
        self.tpm, self.record = tpm, record

    def _key(self) -> ec.EllipticCurvePrivateKey:
        key = self.tpm.keys.get(self.record.handle)
        if key is None or spki(key.public_key()).hex() != self.record.public_spki_hex:
            raise Unauthenticated(CLEARED)
        return key

    async def public_key(self) -> ec.EllipticCurvePublicKey:
        return self._key().public_key()

    async def sign(self, message: bytes) -> bytes:
        self.tpm.signed += 1
        return attest.sign(self._key(), message)

    async def check(self, cert: x509.Certificate) -> None:
        named = ak_uri_of(cert)
        if named is not None and named != self.tpm.ak_uri():
            raise Unauthenticated(ANOTHER_AK)
        if spki(self._key().public_key()) != spki(cert.public_key()):  # type: ignore[arg-type]
            raise Unauthenticated(CLEARED)

    async def next_key(self, node_id: str) -> NextKey:
        other = HANDLES[1] if self.record.handle == HANDLES[0] else HANDLES[0]
        record = self.tpm.create(other)
        key = self.tpm.keys[other]
        csr_der = make_csr(key, node_id).public_bytes(serialization.Encoding.DER)
        return NextKey(key.public_key(), csr_der, record.dump(), certify(self.tpm.ak, key.public_key()))

    async def adopt(self, nxt: NextKey) -> None:
        old = self.record.handle
        self.record = TpmRecord.load(nxt.stored)
        if old != self.record.handle:
            self.tpm.keys.pop(old, None)


def tpm_pb(c: TpmCertification) -> join_pb2.TpmCertification:
    return join_pb2.TpmCertification(
        ak_spki_der=c.ak_spki_der, key_public=c.key_public, attest=c.attest, signature=c.signature
    )


async def soft_join(server: str, token: str, data_dir: Path, tpm: SoftTpm) -> SoftTpmKey:
    """`bc join --attestor tpm` with a software TPM: the same request, answer check and files as `join_node`."""
    parsed = tokens.parse_token(token)
    record = tpm.create(HANDLES[0])
    key = tpm.keys[HANDLES[0]]
    csr_der = make_csr(key, "pending").public_bytes(serialization.Encoding.DER)
    req = join_pb2.JoinRequest(
        csr_der=csr_der,
        hostname="soft-tpm",
        token_id=parsed.token_id,
        token_proof=tokens.join_proof(parsed.secret, parsed.token_id, csr_der),
        tpm=tpm_pb(certify(tpm.ak, key.public_key())),
    )
    host, port = split_server(server.split(",")[0])
    ca_pem = await asyncio.to_thread(fetch_pinned_ca, host, port, parsed.ca_pin)
    leaf_key, leaf_cert = tokens.join_client_credentials(parsed, SystemClock())
    async with grpc.aio.secure_channel(server.split(",")[0], channel_credentials(ca_pem, leaf_key, leaf_cert)) as ch:
        resp: join_pb2.JoinResponse = await join_pb2_grpc.JoinStub(ch).Join(req, timeout=20)
    trust = resp.trust.SerializeToString(deterministic=True)
    ca = keys.load_cert_pem(ca_pem)
    assert join_answer.verify_answer(ca, csr_der, resp.cert_pem, trust, resp.answer_signature, list(resp.ssh_ca_keys))
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    atomic_write(data_dir / "node.key", record.dump(), 0o600)
    atomic_write(data_dir / "node.crt", resp.cert_pem)
    atomic_write(data_dir / "ca.crt", ca_pem)
    Identity(
        node_id=resp.node_id,
        role=resp.role,
        server=server,
        identity_generation=resp.identity_generation,
        ca_fingerprint=parsed.ca_pin,
        trust_bundle_b64=base64.b64encode(resp.trust.SerializeToString()).decode(),
        join_ssh_ca_keys=list(resp.ssh_ca_keys),
    ).save(data_dir)
    return SoftTpmKey(tpm, record)


def soft_tpm_parts(opts: AgentOptions, holder: SoftTpmKey) -> AgentParts:
    """`production_parts` for a node whose TPM is `holder`'s: the same wiring, the TPM swapped at its edge."""
    parts = production_parts(opts)
    assert parts.session_keys is not None, "node.key holds a TPM record: production_parts made session keys"
    keeper = SessionKeys(opts.data_dir, parts.identity, holder, parts.clock, parts.rng)
    pair = MemoryPair(keeper.pair)
    return dataclasses.replace(
        parts,
        key_holder=holder,
        session_keys=keeper,
        node_key=NodeKey(None, source=keeper.key),
        dial=grpc_dial(opts.data_dir, parts.identity, parts.ca_pem, to_thread, parts.rng, pair),
    )
