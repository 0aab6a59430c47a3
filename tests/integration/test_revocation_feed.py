"""The gateway's certificate feed: revoked and expired certificates lose their sessions, and stay out."""

from __future__ import annotations

import asyncio
import dataclasses
import json

from agent.identity import Identity
from bc.errors import Unauthenticated
from bc.gateway.session_driver import SessionDriver
from tests.integration.conftest import InprocLab


async def registered_session(lab: InprocLab, node_id: str) -> SessionDriver:
    """The gateway's driver of the node's session: it registers itself just after the Hello commits, so a
    test that saw `connected` in the events log may get there first."""
    async with asyncio.timeout(10):
        while node_id not in lab.server.gateway.sessions:
            await asyncio.sleep(0.02)
    return lab.server.gateway.sessions[node_id]


async def test_a_revoked_session_is_told_why_closed_and_never_redialed(lab: InprocLab) -> None:
    await lab.join("n1")
    agent = await lab.start_node("n1")
    opened = await lab.wait_connected("n1")
    serial = (await registered_session(lab, "n1")).peer.serial

    info = await lab.admin.revoke_node("n1", reason="compromised host")
    assert info.revoked and info.revoke_reason == "compromised host"
    gone = await lab.wait_event(
        "node.connectivity", lambda ev, d: ev.subject == "n1" and d["state"] == "disconnected", timeout=5
    )
    assert json.loads(gone.data_json)["reason"] == "certificate revoked: compromised host"
    await asyncio.wait_for(lab.tasks["n1"], 10)  # the agent stops instead of redialing
    assert agent.revoked_reason == "certificate revoked: compromised host"
    assert Identity.load(lab.node_dir("n1")).revoked == "certificate revoked: compromised host"
    revoked = await lab.wait_event("security.node.revoked", lambda ev, d: ev.subject == "n1")
    assert json.loads(revoked.data_json)["serials"] == [serial]

    # The serial is refused before a session starts, and no new epoch was ever opened for it.
    try:
        await lab.server.gateway.refuse_revoked(serial)
    except Unauthenticated as e:
        assert "certificate revoked: compromised host" in e.message
    else:
        raise AssertionError("a revoked serial was let through")
    assert (await lab.admin.get_node("n1")).session_epoch == json.loads(opened.data_json)["epoch"]

    # Started again, the agent refuses to dial with the revoked identity.
    lab.agents.pop("n1")
    lab.tasks.pop("n1")
    again = await lab.start_node("n1")
    try:
        await asyncio.wait_for(lab.tasks.pop("n1"), 10)
    except Unauthenticated as e:
        assert "bc join --reset --yes" in e.message
    else:
        raise AssertionError("a revoked identity started")
    lab.agents.pop("n1")
    assert not again.connected.is_set()


async def test_a_session_whose_certificate_expired_is_closed_and_the_node_comes_back_renewed(lab: InprocLab) -> None:
    await lab.join("n1")
    await lab.start_node("n1")
    first = await lab.wait_connected("n1")
    driver = await registered_session(lab, "n1")
    # What the feed would see a day later: the certificate the session was opened with has run out.
    driver.peer = dataclasses.replace(driver.peer, not_after=0.0)
    await lab.server.gateway.check_certificates()
    closed = await lab.wait_event(
        "node.connectivity", lambda ev, d: ev.subject == "n1" and d["state"] == "disconnected", timeout=5
    )
    assert json.loads(closed.data_json)["reason"] == "certificate expired; renew and reconnect"
    # Not a revocation: the agent redials (with its valid certificate) and is welcomed again.
    await lab.wait_connected("n1", after_seq=first.seq)
    assert not lab.agents["n1"].revoked_reason
