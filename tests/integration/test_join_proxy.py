"""Join through a gateway-only process, forwarded to an api process (`bc.api.join_proxy`).

Real servers in this process (real gRPC on 127.0.0.1, real certificates, one SQLite file or one PostgreSQL
schema): an api+worker `bc serve` and a gateway-only one that holds no CA key. A node joins through the
gateway's address alone, or past an address that answers nothing; with no api process to reach, `bc join`
says so in one line. A compromised gateway is the production gateway with its link to the api wrapped in a
tamperer (what it would run): swapping the CSR for one of its own keys is refused and leaves the token
unused, and rewriting the answer's trust bundle is refused by the node, which stores nothing.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from agent.identity import Identity
from agent.join import join_node
from bc.api.api_link import ApiLink, Metadata
from bc.assembly.server import Server
from bc.cli.main import cli
from bc.errors import Unauthenticated
from bc.pki import keys
from bc.pki.identity import make_csr
from bc.protocol.pb import join_pb2
from bc.store import gateway_keys as gk_sql
from tests.integration.conftest import InprocLab, gateway_only_server, open_lab
from tests.integration.test_keyless_gateway import keyless_pair


class TamperingLink(ApiLink):
    """The production link to the api with a compromised gateway's hands on what passes through it."""

    def __init__(
        self,
        inner: ApiLink,
        request: Callable[[join_pb2.JoinRequest], None] | None = None,
        answer: Callable[[join_pb2.JoinResponse], None] | None = None,
    ) -> None:
        super().__init__(inner.credentials)
        self.inner, self.request, self.answer = inner, request, answer
        self.forwarded: list[join_pb2.JoinRequest] = []

    async def join(self, address: str, request: join_pb2.JoinRequest) -> join_pb2.JoinResponse:
        sent = join_pb2.JoinRequest()
        sent.CopyFrom(request)
        if self.request is not None:
            self.request(sent)
        self.forwarded.append(sent)
        response = await self.inner.join(address, sent)
        if self.answer is not None:
            self.answer(response)
        return response

    async def renew(self, address: str, request: join_pb2.RenewRequest, metadata: Metadata) -> join_pb2.RenewResponse:
        return await self.inner.renew(address, request, metadata)


def tamper(
    gw: Server,
    request: Callable[[join_pb2.JoinRequest], None] | None = None,
    answer: Callable[[join_pb2.JoinResponse], None] | None = None,
) -> TamperingLink:
    """Wrap the gateway's production link (unwrapping an earlier tamperer, so each test step stands alone)."""
    assert gw.join_proxy is not None
    inner = gw.join_proxy.link
    if isinstance(inner, TamperingLink):
        inner = inner.inner
    link = TamperingLink(inner, request, answer)
    gw.join_proxy.link = link
    return link


async def token_row(lab: InprocLab, token_id: str) -> dict[str, object]:
    assert lab.server.store is not None
    async with lab.server.store.transaction(write=False) as tx:
        row = await tx.fetchone("SELECT used_at_ms FROM join_tokens WHERE token_id = :id", {"id": token_id})
        n = int(await tx.fetchval("SELECT COUNT(*) FROM node_certs"))
    assert row is not None
    return {"used_at_ms": row["used_at_ms"], "certs": n}


async def bc(*args: str) -> Result:
    return await asyncio.to_thread(CliRunner().invoke, cli, list(args))


async def test_a_node_joins_through_a_gateway_address_past_one_that_answers_nothing(
    tmp_path: Path, store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="bc.join")
    async with keyless_pair(tmp_path, store_url) as (lab, gw):
        tok = await lab.admin.create_token("n1")
        d = lab.node_dir("n1")
        joined = await join_node(f"127.0.0.1:1,{gw.address}", tok.token, d)
        assert joined.node_id == "n1"
        ident = Identity.load(d)
        assert ident.server == f"127.0.0.1:1,{gw.address}", "the session dials every address given"
        # The certificate is the api CA's, for the key this node made, and the trust the api's own.
        cert = keys.load_cert_pem((d / "node.crt").read_bytes())
        cert.verify_directly_issued_by(gw.ca_cert)
        assert cert.public_key() == keys.load_key_pem((d / "node.key").read_bytes()).public_key()
        held = lab.server.intent.trust_bundle().SerializeToString(deterministic=True)
        assert base64.b64decode(ident.trust_bundle_b64) == held
        assert "event=join.forwarded gateway=gw-k" in caplog.text, "the api took it from the gateway"
        await lab.start_node("n1")
        await lab.wait_connected("n1", timeout=30)
        assert (await lab.admin.get_node("n1")).gateway_id == "gw-k"


async def test_a_compromised_gateway_cannot_swap_the_csr_or_rewrite_the_answer(tmp_path: Path, store_url: str) -> None:
    async with keyless_pair(tmp_path, store_url) as (lab, gw):
        tok = await lab.admin.create_token("n1")
        d = lab.node_dir("n1")
        before = await token_row(lab, tok.token_id)

        # Its own key in the CSR, the node's proof beside it: the api refuses, the token stays unused.
        own_key = keys.generate_key()
        own_csr = make_csr(own_key, "n1").public_bytes(serialization.Encoding.DER)

        def swap_csr(req: join_pb2.JoinRequest) -> None:
            req.csr_der = own_csr

        link = tamper(gw, request=swap_csr)
        with pytest.raises(Unauthenticated, match="secret does not match"):
            await join_node(gw.address, tok.token, d)
        assert link.forwarded and link.forwarded[0].csr_der == own_csr, "the swapped CSR reached the api"
        assert await token_row(lab, tok.token_id) == before, "no certificate, the token unused"
        assert not Identity.exists(d)

        # The same token through the same gateway with the answer rewritten: a root of its own in the trust
        # bundle (it would sign this node's commands). The node checks the CA's signature and stores nothing.
        rogue_root = ed25519.Ed25519PrivateKey.generate().public_key()

        def own_root(resp: join_pb2.JoinResponse) -> None:
            del resp.trust.command_signing_roots[:]
            resp.trust.command_signing_roots.append(
                rogue_root.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
            )

        tamper(gw, answer=own_root)
        with pytest.raises(Unauthenticated, match="not signed by the CA the token pins"):
            await join_node(gw.address, tok.token, d)
        assert not Identity.exists(d) and not (d / "node.crt").exists()

        # An honest answer from an earlier join (its CA signature valid, but over another CSR) is refused too.
        honest = await lab.admin.create_token("n2")
        answers: list[join_pb2.JoinResponse] = []
        tamper(gw, answer=answers.append)
        await join_node(gw.address, honest.token, lab.node_dir("n2"))
        replay = await lab.admin.create_token("n3")

        def replayed(resp: join_pb2.JoinResponse) -> None:
            resp.CopyFrom(answers[0])

        tamper(gw, answer=replayed)
        with pytest.raises(Unauthenticated, match="not signed by the CA the token pins"):
            await join_node(gw.address, replay.token, lab.node_dir("n3"))
        assert not Identity.exists(lab.node_dir("n3"))


async def test_bc_join_says_in_one_line_when_the_gateway_reaches_no_api_process(tmp_path: Path, store_url: str) -> None:
    shared = store_url or str(tmp_path / "server" / "bc.db")
    async with open_lab(tmp_path, store=shared, roles=frozenset({"api", "worker"})) as lab:
        tok = await lab.admin.create_token("n1")
        gw = gateway_only_server(tmp_path / "gw", shared)
        await gw.start()
    # The api process has stopped and taken its registration with it; the gateway runs on.
    try:
        d = tmp_path / "n1"
        r = await bc("join", "--server", gw.address, "--token", tok.token, "--data-dir", str(d))
        assert r.exit_code == 5, r.output  # Unavailable
        assert r.output.count("\n") == 1, r.output
        assert r.output == (
            f"error: cannot join through {gw.address}: gateway gw-k finds no api process registered in the store"
            " to join through; start one on this store (bc serve --roles api)\n"
        )
        # An api registered but not answering (a process killed inside its registration's 20 s).
        assert gw.store is not None
        now_ms = await gw.store.now_ms()
        async with gw.store.transaction() as tx:
            await gk_sql.register_api(tx, "ghost", "127.0.0.1:1", now_ms, 20_000)
        r = await bc("join", "--server", gw.address, "--token", tok.token, "--data-dir", str(d))
        assert r.exit_code == 5, r.output  # Unavailable
        assert r.output.count("\n") == 1, r.output
        assert r.output.startswith(
            f"error: cannot join through {gw.address}: gateway gw-k reaches none of the 1 api process(es) to join"
            " through (last: 127.0.0.1:1: "
        ), r.output
        assert not Identity.exists(d)
    finally:
        await gw.stop()
