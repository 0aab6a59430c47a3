"""Shell typescripts against a real `bc serve` and agent (SQLite and PostgreSQL): the `--record` policy and who may
set it, the promise in the ticket, who may upload a typescript and how much, reading it back (docs/access.md,
"Typescripts"). The real `bc shell --record` on a real sshd is in tests/integration/test_tunnel_ssh.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bc.client.tunnel import TunnelClient
from bc.control.trust import typescripts
from bc.errors import Conflict, NotFound, Unauthenticated, UsageError
from bc.pki import exec_tickets
from tests.integration.conftest import InprocLab, open_lab
from tests.integration.operators_lab import add_operator
from tests.integration.test_tunnels import client, ready


@pytest.fixture
async def lab(tmp_path: Path, store_url: str) -> AsyncIterator[InprocLab]:
    async with open_lab(tmp_path, store=store_url, tunnels=True) as lab:
        yield lab


@pytest.fixture
async def sink_port() -> AsyncIterator[int]:
    async def sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(65536):
            pass
        writer.close()

    server = await asyncio.start_server(sink, "127.0.0.1", 0)
    yield int(server.sockets[0].getsockname()[1])
    server.close()
    await server.wait_closed()


async def read_all(c: TunnelClient, sid: str) -> bytes:
    return b"".join([chunk async for chunk in c.typescript(sid)])


async def test_the_policy_is_off_by_default_and_only_an_admin_sets_it(lab: InprocLab) -> None:
    viewer = await add_operator(lab, "vera", "viewer")
    operator = await add_operator(lab, "otto", "operator")
    async with TunnelClient(viewer) as c:
        assert await c.record_policy() == "off"
    async with TunnelClient(operator) as c:
        with pytest.raises(Unauthenticated, match="admin"):
            await c.record_policy(set_to="required")
    async with client(lab) as c:
        with pytest.raises(UsageError, match="not one of"):
            await c.record_policy(set_to="sometimes")
        assert await c.record_policy(set_to="required") == "required"
        assert await c.record_policy() == "required"
    ev = await lab.wait_event("tunnel.record-policy", lambda ev, d: d["policy"] == "required")
    assert json.loads(ev.data_json)["was"] == "off"


async def test_the_promise_follows_the_policy(lab: InprocLab, sink_port: int) -> None:
    await ready(lab)
    async with client(lab) as c:
        with pytest.raises(Conflict, match="typescripts are off"):
            await c.issue("n1", "shell", sink_port, "look", record=True)
        await c.record_policy(set_to="required")
        with pytest.raises(Conflict, match="required"):
            await c.issue("n1", "shell", sink_port, "look")
        with pytest.raises(UsageError, match="only a shell"):
            await c.issue("n1", "forward", sink_port, record=True)
        t = await c.issue("n1", "shell", sink_port, "look", record=True)
        assert t.record and exec_tickets.peek(t.token).record  # the signed ticket carries `rec`, the node sees it
        await c.issue("n1", "forward", sink_port)  # a port-forward is no shell: the policy does not apply
        await c.record_policy(set_to="optional")
        assert not exec_tickets.peek((await c.issue("n1", "shell", sink_port, "look")).token).record
    issued = await lab.wait_event("tunnel.ticket-issued", lambda ev, d: d["sid"] == t.sid)
    assert json.loads(issued.data_json)["record"] is True


async def test_only_the_tickets_operator_uploads_in_order_and_within_the_bound(
    lab: InprocLab, sink_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    await ready(lab)
    other = await add_operator(lab, "otto", "operator")
    monkeypatch.setattr(typescripts, "MAX_TYPESCRIPT", 100_000)
    async with client(lab) as c:
        await c.record_policy(set_to="optional")
        plain = await c.issue("n1", "shell", sink_port, "no promise")
        with pytest.raises(Conflict, match="promised no typescript"):
            await c.upload_typescript(plain.sid, 0, b"x")
        t = await c.issue("n1", "shell", sink_port, "look", record=True)
        async with TunnelClient(other) as o:
            with pytest.raises(Unauthenticated, match="not by otto"):
                await o.upload_typescript(t.sid, 0, b"forged")
            with pytest.raises(Unauthenticated, match="admin"):  # an operator reads no typescript
                await read_all(o, t.sid)
        with pytest.raises(UsageError, match="at most 65536"):
            await c.upload_typescript(t.sid, 0, b"x" * (64 * 1024 + 1))
        assert await c.upload_typescript(t.sid, 0, b"a" * 60_000) == 60_000
        with pytest.raises(Conflict, match="out of order"):
            await c.upload_typescript(t.sid, 0, b"again")
        with pytest.raises(Conflict, match="at most"):  # 60,000 + 50,000 is over the bound of 100,000
            await c.upload_typescript(t.sid, 60_000, b"b" * 50_000)
        assert await c.upload_typescript(t.sid, 60_000, b"\x1b[2Jend\r\n", done=True) == 60_009
        with pytest.raises(Conflict, match="complete already"):
            await c.upload_typescript(t.sid, 60_009, b"more")
        assert await read_all(c, t.sid) == b"a" * 60_000 + b"\x1b[2Jend\r\n"
        with pytest.raises(NotFound, match="promised none"):
            await read_all(c, plain.sid)
        [row] = [r for r in await c.list("n1") if r.sid == t.sid]
        assert row.record and row.typescript == "complete" and row.typescript_bytes == 60_009


async def test_after_the_session_and_its_grace_the_typescript_is_closed_and_marked_missing(
    lab: InprocLab, sink_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    await ready(lab)
    monkeypatch.setattr(typescripts, "GRACE_MS", 0)
    async with client(lab) as c:
        await c.record_policy(set_to="required")
        ticket = await c.issue("n1", "shell", sink_port, "look", record=True)
        tunnel = await c.open(ticket)
        [row] = [r for r in await c.list("n1") if r.sid == ticket.sid]
        assert row.typescript == "pending"  # open: its typescript may still come
        await tunnel.close(exit_code=0)
        await lab.wait_event("tunnel.closed", lambda ev, d: d["sid"] == ticket.sid)
        with pytest.raises(Conflict, match="ended"):
            await c.upload_typescript(ticket.sid, 0, b"too late")
        [row] = [r for r in await c.list("n1") if r.sid == ticket.sid]
        assert row.state == "closed" and row.typescript == "missing" and row.typescript_bytes == 0
