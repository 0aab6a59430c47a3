"""A tunnel through whichever gateway holds the node's session (docs/access.md, "Gateways").

Real processes on one PostgreSQL store: `bc serve --roles api --tunnels` (the operator's CLI talks to it only)
and `bc serve --roles gateway` from an empty data dir (its certificate from the api, through the store); n1
joins and holds its session on the gateway. `bc tunnel n1 PORT` through the api reaches a TCP server on n1's
loopback and carries bytes both ways: the api relays to the gateway (`GatewayTunnels.Relay`), which offers the
ticket to the node. An operator's certificate is refused on that internal RPC; `bc tunnels close` closes a
relayed tunnel within 2 s; a gateway killed -9 makes the next tunnel answer `node-unavailable` within a bound.
"""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from bc.protocol.pb.tunnel_pb2 import TunnelFrame, TunnelOpen
from bc.runtime.config import OperatorConfig
from bc.wire.stubs import tunnel_pb2_grpc
from bc.wire.tls import channel_credentials
from tests.pg import fresh_schema_sync, schema_url

from .harness import Lab, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

GONE_BOUND_S = 15.0
"""A tunnel to a node whose gateway is gone is refused within this long (the route's answer bound is 12 s; a
killed process's port refuses the connection at once)."""


@pytest.fixture
def pong_port() -> Iterator[int]:
    """A TCP server on this host's loopback (the node's: the agent runs here): it reads to EOF and answers
    `pong:` and what it read, reversed, so the answer proves the bytes went up and came down."""
    srv = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                data = b""
                while chunk := conn.recv(65536):
                    data += chunk
                conn.sendall(b"pong:" + data[::-1])

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    yield int(srv.getsockname()[1])
    stop.set()
    th.join(5)  # it sees `stop` within its 0.2 s accept timeout: the socket is closed under no accept
    srv.close()


def tunnel(lab: Lab, port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [lab.bc_path, "tunnel", "n1", str(port)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=lab.env,
    )


def api_and_gateway(lab: Lab, store: str) -> int:
    """`bc serve --roles api --tunnels` (the lab's CLI talks to it) and `--roles gateway` from an empty data dir;
    n1 joined and converged through the gateway, its session there. The gateway's port."""
    lab.serve("api", lab.server_dir, lab.port, store, "--gateway-id", "api", "--roles", "api", "--tunnels")
    gw_dir, gw_port = lab.root / "server-gw", free_port()
    lab.serve("gw", gw_dir, gw_port, store, "--gateway-id", "gw", "--roles", "gateway")
    servers = f"127.0.0.1:{gw_port}"
    lab.bc("join", "--server", servers, "--token", lab.token("n1"), "--data-dir", str(lab.node_dir("n1")))
    lab.node("n1")
    lab.wait_converged("n1", timeout=40)
    assert lab.show("n1")["gateway_id"] == "gw"
    return gw_port


def test_a_tunnel_through_the_api_rides_the_gateway_that_holds_the_session(lab: Lab, pong_port: int) -> None:
    with fresh_schema_sync() as (url, schema):
        store = schema_url(url, schema)
        gw_port = api_and_gateway(lab, store)

        # Bytes both ways, through the api and the gateway.
        payload = bytes(range(256)) * 64
        p = tunnel(lab, pong_port)
        out, err = p.communicate(payload, timeout=60)
        assert p.returncode == 0, err.decode(errors="replace")
        assert out == b"pong:" + payload[::-1]
        rows = lab.bc("tunnels", "list", "--node", "n1")
        row = rows[0] if isinstance(rows, list) else rows["tunnels"][0]
        assert row["gateway_id"] == "gw" and row["state"] == "closed", row
        assert row["bytes_up"] > len(payload) and row["bytes_down"] > len(payload), row
        assert "event=tunnel.routed" in lab.log("api") and "event=tunnel.relay-asked" in lab.log("gw")

        # The internal RPC refuses an operator's certificate.
        cfg = OperatorConfig.load(lab.server_dir / "operator" / "config.json")
        creds = channel_credentials(cfg.ca_pem, cfg.key_pem, cfg.cert_pem)
        with grpc.secure_channel(f"127.0.0.1:{gw_port}", creds) as channel:
            call = tunnel_pb2_grpc.GatewayTunnelsStub(channel).Relay(
                iter([TunnelFrame(open=TunnelOpen(token="x", node_id="n1", sid="t-forged"))]), timeout=10
            )
            with pytest.raises(grpc.RpcError) as refused:
                list(call)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, refused.value
        assert "gateway certificate" in (refused.value.details() or "")

        # An admin's close reaches the relayed tunnel within 2 s.
        p = tunnel(lab, pong_port)
        try:
            sid = lab.wait_for(
                "the tunnel to open",
                lambda: next((r["sid"] for r in _rows(lab) if r["state"] == "open"), None),
                timeout=30,
            )
            t0 = time.monotonic()
            lab.bc("tunnels", "close", sid, "--reason", "test")
            p.wait(timeout=10)
            took = time.monotonic() - t0
            assert took < 2.0, took
            assert p.returncode != 0
            assert next(r for r in _rows(lab) if r["sid"] == sid)["state"] == "closed"
        finally:
            if p.poll() is None:
                p.kill()
            p.communicate(timeout=10)

        # The gateway gone: the next tunnel is refused `node-unavailable` within a bound, never hangs.
        lab.kill("gw")
        p = tunnel(lab, pong_port)
        t0 = time.monotonic()
        _out, err = p.communicate(b"", timeout=GONE_BOUND_S + 30)
        took = time.monotonic() - t0
        assert p.returncode == 6, err  # TicketRefused: the reason `node-unavailable`
        assert "gateway gw" in err.decode() and "did not relay the tunnel" in err.decode(), err
        assert took < GONE_BOUND_S, took
        newest = _rows(lab)[0]
        assert newest["state"] == "refused" and newest["gateway_id"] == "gw", newest


def test_revoking_the_node_closes_its_relayed_tunnel_within_2_s(lab: Lab, pong_port: int) -> None:
    """The gateway's side ends first (its revocation feed closes the node's tunnels): the `Relay` call ends, and
    with it the api's relay and the operator's tunnel."""
    with fresh_schema_sync() as (url, schema):
        api_and_gateway(lab, schema_url(url, schema))
        p = tunnel(lab, pong_port)
        try:
            sid = lab.wait_for(
                "the tunnel to open",
                lambda: next((r["sid"] for r in _rows(lab) if r["state"] == "open"), None),
                timeout=30,
            )
            lab.bc("nodes", "revoke", "n1", "--reason", "test")
            t0 = time.monotonic()
            p.wait(timeout=10)
            took = time.monotonic() - t0
            assert took < 2.0, took
            assert p.returncode != 0
            row = lab.wait_for(
                "the record closed",
                lambda: next((r for r in _rows(lab) if r["sid"] == sid and r["state"] == "closed"), None),
            )
            assert row["gateway_id"] == "gw", row
        finally:
            if p.poll() is None:
                p.kill()
            p.communicate(timeout=10)


def _rows(lab: Lab) -> list[dict[str, object]]:
    rows = lab.bc("tunnels", "list", "--node", "n1")
    return list(rows if isinstance(rows, list) else rows["tunnels"])
