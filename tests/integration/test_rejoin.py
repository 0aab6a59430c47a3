"""Re-join after expiry, end to end: a real `bc serve` over gRPC and mutual TLS, a real agent on fake GPUs.

The server starts with its clock (and so its store's and its CA's) some days in the past, so the node's
24 h certificate, issued then, has expired by the time the clock is stepped back to the present: the
node was "offline" across its expiry. TLS judges certificates by the host's real clock, which is why the
past is moved rather than the future: the certificate a re-join issues must be valid for the agent's next
handshake. On PostgreSQL the store is opened on the server's clock (`db_clock=False`, as the virtual-time
tests open it) rather than the database's, so that it moves with the step too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import random
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from cryptography import x509

from agent.identity import Identity
from agent.join import join_node
from agent.key_holder import FileNodeKey, NodeKeyHolder
from agent.renewal import Renewer
from bc.assembly.server import Seams, Server
from bc.errors import Unauthenticated
from bc.pki import attest, keys
from bc.pki.secrets_source import SystemSecrets, os_seeded_random
from bc.seams.clock import Clock, LoopClock, SystemClock
from bc.store import Store, open_store
from tests.integration.conftest import InprocLab, open_lab, role_options

DAY_S = 24 * 3600


class PastLab:
    """A lab whose server clock starts `days` in the past; `to_present()` steps it to the host's time."""

    def __init__(self, lab: InprocLab, clock: LoopClock, back_s: float, seams: Seams) -> None:
        self.lab, self.clock, self.back_s, self.seams = lab, clock, back_s, seams

    def to_present(self) -> None:
        self.clock.step(self.back_s)


@pytest.fixture
def back_days() -> float:
    return 2.0


@pytest.fixture
def roles() -> frozenset[str] | None:
    return None  # every role in the lab's one process


@pytest.fixture
async def past(
    tmp_path: Path, store_url: str, back_days: float, roles: frozenset[str] | None
) -> AsyncIterator[PastLab]:
    loop = asyncio.get_running_loop()
    back_s = back_days * DAY_S
    clock = LoopClock(wall_offset=time.time() - loop.time() - back_s)

    async def opener(url: str, store_clock: Clock) -> Store:
        if not url.startswith("postgresql://"):
            return await open_store(url, store_clock)
        from bc.store.postgres import PostgresStore

        store = PostgresStore(url, store_clock, db_clock=False)
        await store.open(migrate=True)
        return store

    seams = Seams(clock, os_seeded_random(), SystemSecrets(), store_opener=opener)
    extra = {} if roles is None else {"roles": roles}
    async with open_lab(tmp_path, seams, store=store_url, **extra) as lab:
        yield PastLab(lab, clock, back_s, seams)


def _serial(d: Path) -> str:
    return format(keys.load_cert_pem((d / "node.crt").read_bytes()).serial_number, "x")


async def _session_journal(lab: InprocLab, node_id: str) -> str:
    assert lab.server.store is not None
    async with lab.server.store.transaction(write=False) as tx:
        return str(await tx.fetchval("SELECT journal_id FROM node_sessions WHERE node_id = :n", {"n": node_id}))


async def _reasons(lab: InprocLab) -> list[str]:
    return [json.loads(ev.data_json)["reason"] for ev in await lab.admin.list_events(type_prefix="security.rejoin.")]


def _renewer(d: Path, key_holder: NodeKeyHolder | None = None) -> Renewer:
    return Renewer(d, Identity.load(d), SystemClock(), random.Random(1), key_holder=key_holder)


class ForgingKey(FileNodeKey):
    """The node's key holder in a forger's hands: it signs with a key of its own and never checks."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.key = keys.generate_key()

    async def sign(self, message: bytes) -> bytes:
        return attest.sign(self.key, message)

    async def check(self, cert: x509.Certificate) -> None:
        return None


async def test_a_node_offline_past_its_expiry_rejoins_with_its_key_and_keeps_id_labels_and_journal(
    past: PastLab,
) -> None:
    lab = past.lab
    await lab.join("n1")
    d = lab.node_dir("n1")
    await lab.admin.label_node("n1", {"rack": "r7"}, [])
    old_serial, old_key = _serial(d), (d / "node.key").read_bytes()
    shutil.copytree(d, lab.root / "n1-stolen-copy")  # what a replay would hold, taken before the re-join

    # The agent starts while the server still lives two days back: the node's clock says the certificate has
    # expired, the server's that the proof comes from two days ahead, and the server has the last word.
    first = await lab.start_node("n1")
    ev = await lab.wait_event("security.rejoin.refused", lambda ev, data: ev.subject == "n1")
    assert json.loads(ev.data_json)["reason"] == "rejoin:stale-timestamp"
    journal_id = first.journal.journal_id
    await lab.stop_node("n1")

    past.to_present()  # the store's clock passes the expiry (by a day)
    agent = await lab.start_node("n1")
    ev = await lab.wait_event("node.rejoined", lambda ev, data: ev.subject == "n1", timeout=30)
    data = json.loads(ev.data_json)
    assert data["previous_serial"] == old_serial != data["serial"]
    assert DAY_S - 120 <= data["expired_for_s"] <= DAY_S + 120
    await lab.wait_connected("n1", after_seq=ev.seq, timeout=60)

    # Same node, same identity generation, labels and journal; a new key and certificate.
    ident = Identity.load(d)
    assert (ident.node_id, ident.identity_generation) == ("n1", 1)
    assert _serial(d) == data["serial"] and (d / "node.key").read_bytes() != old_key
    assert (await lab.admin.get_node("n1")).labels["rack"] == "r7"
    assert agent.journal.journal_id == journal_id == await _session_journal(lab, "n1")
    assert not list(d.glob("*.reset-*"))
    cmd = await lab.admin.run_command("n1", "inventory.refresh")
    await lab.wait_event("command.settled", lambda ev, data: ev.subject == cmd.id, timeout=30)
    assert (await lab.admin.get_command(cmd.id)).state == "succeeded"

    # The same expired certificate cannot re-join twice: a newer one of its identity exists now.
    with pytest.raises(Unauthenticated, match="not the node's latest certificate"):
        await _renewer(lab.root / "n1-stolen-copy").rejoin_once()
    assert (await _reasons(lab))[-1] == "rejoin:not-latest"


@pytest.mark.parametrize("back_days", [9.0])
async def test_after_7_days_the_node_needs_a_new_token_and_the_error_says_so(
    past: PastLab, caplog: pytest.LogCaptureFixture
) -> None:
    lab = past.lab
    await lab.join("n1")
    d = lab.node_dir("n1")
    past.to_present()  # the certificate expired 8 days ago
    caplog.set_level(logging.INFO, logger="agent.renewal")
    await asyncio.wait_for(_renewer(d).run(), 60)  # the agent's loop: it stops on the refusal
    impossible = [r.getMessage() for r in caplog.records if "event=renewal.impossible" in r.getMessage()]
    assert len(impossible) == 1
    assert "more than 7 days ago, so the node cannot re-join with its key" in impossible[0]
    assert "bc join --reset --yes" in impossible[0]
    assert await _reasons(lab) == ["rejoin:too-late"]

    # The recovery the sentence names: a new token, the old identity and journal moved aside.
    (d / "journal.db").write_bytes(b"the old journal")
    tok = await lab.admin.create_token("n1")
    joined = await join_node(lab.server.address, tok.token, d, reset=True)
    assert Identity.load(d).identity_generation == 2
    assert {p.name.split(".reset-")[0] for p in joined.moved_aside} >= {"identity.json", "node.key", "journal.db"}


async def test_a_revoked_certificate_does_not_rejoin(past: PastLab) -> None:
    lab = past.lab
    await lab.join("n1")
    d = lab.node_dir("n1")
    assert lab.server.store is not None
    async with lab.server.store.transaction() as tx:
        await tx.execute(
            "UPDATE node_certs SET revoked_at_ms = :t, revoke_reason = 'test' WHERE serial = :s",
            {"t": await lab.server.store.now_ms(), "s": _serial(d)},
        )
    past.to_present()
    with pytest.raises(Unauthenticated) as ei:
        await _renewer(d).rejoin_once()
    assert ei.value.exit_code == 6
    assert f"certificate {_serial(d)} of node n1 was revoked, so the node cannot re-join" in ei.value.message
    assert await _reasons(lab) == ["rejoin:revoked"]


async def test_a_rejoin_by_another_key_is_refused_without_an_event(past: PastLab) -> None:
    lab = past.lab
    await lab.join("n1")
    d = lab.node_dir("n1")
    past.to_present()
    # The agent itself notices a key that is not its certificate's, before any request.
    keys.write_private_key(d / "node.key", keys.generate_key())
    with pytest.raises(Unauthenticated, match="the node key does not match the node certificate"):
        await _renewer(d).rejoin_once()
    # A forger who sends anyway is refused by the server, and quietly: nothing was proved.
    with pytest.raises(Unauthenticated, match="proof of possession was not made by the expired certificate's key"):
        await _renewer(d, ForgingKey(d / "node.key")).rejoin_once()
    assert await _reasons(lab) == []
    assert not await lab.admin.list_events(type_prefix="node.rejoined")


@pytest.mark.parametrize("roles", [frozenset({"api", "worker"})])
async def test_a_rejoin_through_a_gateway_that_holds_no_key_is_judged_by_the_api(
    past: PastLab, tmp_path: Path, store_url: str
) -> None:
    lab = past.lab
    # The gateway lives on the same clock, and is told the api's address (`--api`): the api's registration in
    # the store is dated by the clock the test steps, and would look two days old until its next renewal.
    store = store_url or str(tmp_path / "server" / "bc.db")
    opts = dataclasses.replace(role_options(tmp_path / "gw", store, "gateway", "gw-k", 30.0), api=[lab.server.address])
    gw = Server(opts, past.seams)
    await gw.start()
    try:
        tok = await lab.admin.create_token("n1")
        d = lab.node_dir("n1")
        await join_node(gw.address, tok.token, d)
        old = _serial(d)
        past.to_present()
        renewed = await _renewer(d).rejoin_once()
        ev = await lab.wait_event("node.rejoined", lambda ev, data: ev.subject == "n1")
        assert json.loads(ev.data_json)["previous_serial"] == old
        assert format(renewed.serial_number, "x") == _serial(d) == json.loads(ev.data_json)["serial"]
        # A forged proof through the same gateway is refused by the api.
        with pytest.raises(Unauthenticated, match=r"proof of possession was not made"):
            await _renewer(d, ForgingKey(d / "node.key")).rejoin_once()
    finally:
        await gw.stop()
