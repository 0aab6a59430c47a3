"""A gateway-only `bc serve` beside an api+worker one on one store: no CA, root or worker key in the gateway.

Two real servers in this process (real gRPC on 127.0.0.1, real certificates, one SQLite file or one
PostgreSQL schema) and a real agent on fake GPUs. The gateway asks for its serving certificate through the
store and the api issues it; the node joins through the gateway (which forwards Join to the api), holds
its session on the gateway, takes the relayed signed trust bundle, a spec the
api signed, a spec change written by the gateway (signed afterwards by the worker key), runs a command, and
renews its certificate through the gateway, which proxies Renew to the api. A compromised gateway's
forwarding (a forged certificate, a proof by another key) is refused UNAUTHENTICATED and issues nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from bc.api.join_proxy import NODE_CERT_MD
from bc.assembly.server import Server
from bc.control.nodes import specs
from bc.control.signing.signer import KeylessSigner
from bc.pki import keys
from bc.pki.ca import CertificateAuthority
from bc.pki.identity import make_csr
from bc.pki.renewal import sign_renew_proof
from bc.pki.secrets_source import SystemSecrets, os_seeded_random
from bc.protocol.pb import join_pb2
from bc.runtime.config import OperatorConfig
from bc.seams.clock import SystemClock
from bc.store import gateway_keys as gk_sql
from bc.store import nodes as nodes_sql
from bc.wire.stubs import join_pb2_grpc
from bc.wire.tls import channel_credentials
from tests.integration.conftest import InprocLab, gateway_only_server, open_lab

CERT_TTL_S = 20


@contextlib.asynccontextmanager
async def keyless_pair(tmp_path: Path, store_url: str) -> AsyncIterator[tuple[InprocLab, Server]]:
    async with open_lab(
        tmp_path, store=store_url, roles=frozenset({"api", "worker"}), node_cert_ttl_s=CERT_TTL_S
    ) as lab:
        shared = store_url or str(tmp_path / "server" / "bc.db")
        gw = gateway_only_server(tmp_path / "gw", shared)
        try:
            await gw.start()
            yield lab, gw
        finally:
            for node_id in list(lab.agents):
                with contextlib.suppress(Exception):
                    await lab.stop_node(node_id)
            await gw.stop()


def _key_files(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file() and p.suffix == ".key")


async def _node_cert_count(lab: InprocLab) -> int:
    assert lab.server.store is not None
    async with lab.server.store.transaction(write=False) as tx:
        return int(await tx.fetchval("SELECT COUNT(*) FROM node_certs"))


async def test_a_node_joins_runs_and_renews_through_a_gateway_that_holds_no_key(
    tmp_path: Path, store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="bc.join_proxy")
    async with keyless_pair(tmp_path, store_url) as (lab, gw):
        # The gateway's data dir holds its own serving key and nothing else that signs.
        assert _key_files(tmp_path / "gw") == ["gateway/serving.key"]
        assert (tmp_path / "gw" / "gateway" / "serving.key").stat().st_mode & 0o777 == 0o600
        assert gw.ca is None and gw.signer.keys is None and isinstance(gw.signer, KeylessSigner)
        assert gw.signer.attested, "signing is on for the install: the store says so"
        assert {"pki/ca.key", "pki/signing/root.key", "pki/signing/worker.key"} <= set(_key_files(tmp_path / "server"))
        leaf = keys.load_cert_pem(gw.serving_chain)
        assert leaf.subject.rfc4514_string() == "CN=gateway:gw-k"
        assert leaf.not_valid_after_utc.timestamp() - time.time() > 29 * 24 * 3600
        # The trust nodes get from the gateway is the api's, byte for byte.
        api_env, gw_env = lab.server.intent.trust_envelope(), gw.trust.trust_envelope()
        assert api_env is not None and gw_env is not None
        assert gw_env.SerializeToString(deterministic=True) == api_env.SerializeToString(deterministic=True)

        tok = await lab.admin.create_token("n1")
        from agent.join import join_node

        # The gateway trusts the install's one join root, derived from the CA it relays, byte for byte as
        # the api does: its TLS answers the token's very first handshake, and it forwards the Join to the api.
        assert gw.tls.join_root_pem == lab.server.tls.join_root_pem
        await join_node(gw.address, tok.token, lab.node_dir("n1"))
        assert "event=join-proxy.forwarded" in caplog.text, "the join went through the gateway's proxy"
        await lab.start_node("n1")
        connected = await lab.wait_connected("n1", timeout=30)
        assert (await lab.admin.get_node("n1")).gateway_id == "gw-k"
        generation = (await lab.admin.get_node("n1")).generation
        await lab.wait_observed("n1", generation, timeout=30)

        # A spec change written on the gateway (as an allocation report's is): stored unsigned and held back,
        # signed by the api process's worker key, then delivered and accepted.
        assert gw.store is not None
        wrote = await specs.set_section(
            gw.store, gw.bus, gw.signer, "n1", "telemetry", '{"otlp_endpoint": "http://127.0.0.1:4317"}'
        )
        assert wrote.changed
        await lab.wait_observed("n1", wrote.generation, timeout=30)
        async with gw.store.transaction(write=False) as tx:
            row = await nodes_sql.spec_delivery(tx, "n1")
        worker = lab.server.signer.keys
        assert row is not None and worker is not None
        assert not row["spec_sign_pending"] and row["spec_key_id"] == worker.worker.key_id
        assert row["spec_signature"], "the spec the node accepted is signed"

        cmd = await lab.admin.run_command("n1", "inventory.refresh")
        await lab.wait_event("command.settled", lambda ev, d: ev.subject == cmd.id, timeout=30)
        assert (await lab.admin.get_command(cmd.id)).state == "succeeded"

        # Renewal at 60 % of a 20 s certificate, through the gateway (the first address the node holds).
        ev = await lab.wait_event("node.cert.renewed", lambda ev, d: ev.subject == "n1", timeout=40)
        assert ev.seq > connected.seq
        await lab.wait_connected("n1", after_seq=ev.seq, timeout=30)
        assert await lab.admin.list_events(type_prefix="security.renew.refused") == []
        assert "event=renew-proxy.forwarded" in caplog.text, "the renewal went through the gateway's proxy"


async def test_a_compromised_gateway_cannot_mint_certificates_through_the_api(tmp_path: Path, store_url: str) -> None:
    async with keyless_pair(tmp_path, store_url) as (lab, gw):
        tok = await lab.admin.create_token("n1")
        from agent.join import join_node

        await join_node(lab.server.address, tok.token, lab.node_dir("n1"))
        d = lab.node_dir("n1")
        node_cert = keys.load_cert_pem((d / "node.crt").read_bytes())
        node_key = keys.load_key_pem((d / "node.key").read_bytes())
        ca_pem = keys.cert_to_pem(gw.ca_cert)
        gw_key = (tmp_path / "gw" / "gateway" / "serving.key").read_bytes()
        gw_creds = channel_credentials(ca_pem, gw_key, gw.serving_chain)
        before = await _node_cert_count(lab)

        def request(proof_key: keys.PrivateKey) -> join_pb2.RenewRequest:
            csr_der = make_csr(keys.generate_key(), "n1").public_bytes(serialization.Encoding.DER)
            ts = round(time.time() * 1000)
            return join_pb2.RenewRequest(
                csr_der=csr_der, timestamp_ms=ts, proof=sign_renew_proof(proof_key, csr_der, ts)
            )

        async def renew(
            creds: grpc.ChannelCredentials, req: join_pb2.RenewRequest, forwarded: x509.Certificate
        ) -> grpc.StatusCode:
            md = ((NODE_CERT_MD, forwarded.public_bytes(serialization.Encoding.DER)),)
            async with grpc.aio.secure_channel(lab.server.address, creds) as ch:
                try:
                    await join_pb2_grpc.JoinStub(ch).Renew(req, metadata=md, timeout=10)
                except grpc.aio.AioRpcError as e:
                    return e.code()
            return grpc.StatusCode.OK

        # A certificate for n1 from a CA of the gateway's own making, with a proof by its key.
        rogue = CertificateAuthority.create(SystemClock(), os_seeded_random(), SystemSecrets())
        forged_key = keys.generate_key()
        csr = make_csr(forged_key, "n1")
        forged = rogue.issue_node_cert(csr, "n1", "node", 1)
        assert await renew(gw_creds, request(forged_key), forged) == grpc.StatusCode.UNAUTHENTICATED
        # The node's real certificate, with a proof by another key.
        assert await renew(gw_creds, request(keys.generate_key()), node_cert) == grpc.StatusCode.UNAUTHENTICATED
        # The node's real certificate forwarded by a caller that is not a gateway (the local operator).
        assert lab.server.operator_config is not None
        op = OperatorConfig.load(lab.server.operator_config)
        op_creds = channel_credentials(ca_pem, op.key_pem, op.cert_pem)
        assert await renew(op_creds, request(node_key), node_cert) == grpc.StatusCode.UNAUTHENTICATED
        assert await _node_cert_count(lab) == before, "nothing was issued"
        # The honest forwarding of the same certificate with the node's own proof does renew.
        assert await renew(gw_creds, request(node_key), node_cert) == grpc.StatusCode.OK
        assert await _node_cert_count(lab) == before + 1


async def test_the_api_issues_and_renews_a_gateways_serving_certificate_through_the_store(
    tmp_path: Path, store_url: str
) -> None:
    async with keyless_pair(tmp_path, store_url) as (lab, gw):
        assert gw.store is not None and gw.gateway_cert is not None
        first = gw.gateway_cert.current
        assert first is not None
        # Ask again (as at 60 % of its life): the api issues a new certificate for the same key. The count is
        # read before asking: the api may issue before the test could read it after (CI saw 2).
        issued = [e.seq for e in await lab.admin.list_events(type_prefix="pki.serving-cert.issued")]
        assert len(issued) == 1
        now_ms = await gw.store.now_ms()
        async with gw.store.transaction() as tx:
            row = await gk_sql.serving_cert(tx, "gw-k")
            assert row is not None
            await gk_sql.request_serving_cert(tx, "gw-k", str(row["hosts"]), str(row["csr_pem"]), now_ms + 1)
        await lab.wait_event("pki.serving-cert.issued", lambda ev, d: ev.seq > issued[0], timeout=20)
        # The gateway's own loop (every second, or at once on a relayed event) swaps it in without a restart.
        async with asyncio.timeout(20):
            while (cur := gw.gateway_cert.current) is None or cur.cert == first.cert:
                await gw.bus.wait_events(0.5)
        assert cur.cert.serial_number != first.cert.serial_number
        assert cur.cert.public_key() == first.cert.public_key()
        served = keys.load_cert_pem(await asyncio.to_thread(served_leaf, gw.port))
        assert served.serial_number == cur.cert.serial_number


def served_leaf(port: int) -> bytes:
    """The leaf the server presents now (the handshake ends there: no client certificate is offered)."""
    return ssl.get_server_certificate(("127.0.0.1", port)).encode()
