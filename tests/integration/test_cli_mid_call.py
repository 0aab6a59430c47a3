"""A server that goes away in the middle of a write: exit 5, and the operator is told it may have happened.

The server is a real gRPC server over mutual TLS on 127.0.0.1, in its own
process, whose handlers block; the test kills it -9 as soon as a call
arrives, as a crash of `bc serve` would. The CLI runs unchanged under
`CliRunner`.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner

from bc.cli.main import cli
from bc.client.admin import WRITE_CHECKS, broke_mid_call, is_write
from bc.protocol.pb import admin_pb2
from tests.integration.test_cli_admin import Pki, _isolate, make_pki, write_config

HANGING_SERVER = """
import sys, threading
from concurrent import futures
import grpc
from bc.protocol.pb import admin_pb2
from bc.wire.stubs import admin_pb2_grpc

class Hanging(admin_pb2_grpc.AdminServicer):
    def _hang(self):
        print("entered", flush=True)
        threading.Event().wait()  # until the test kills this process

    def RunCommand(self, request, context):
        self._hang()

    def ListNodes(self, request, context):
        self._hang()

key, cert, ca = (open(p, "rb").read() for p in sys.argv[1:4])
srv = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
admin_pb2_grpc.add_AdminServicer_to_server(Hanging(), srv)
creds = grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=True)
port = srv.add_secure_port("127.0.0.1:0", creds)
srv.start()
print(port, flush=True)
srv.wait_for_termination()
"""


@dataclass
class Hanging:
    entered: threading.Event


@pytest.fixture
def hanging(tmp_path: Path, pki: Pki, monkeypatch: pytest.MonkeyPatch) -> Iterator[Hanging]:
    """A server process that takes any call and is killed -9 as soon as one arrives."""
    paths = []
    for name, pem in (("key", pki.server_key_pem), ("cert", pki.server_cert_pem), ("ca", pki.ca_pem)):
        (tmp_path / name).write_bytes(pem)
        paths.append(str(tmp_path / name))
    proc = subprocess.Popen(
        [sys.executable, "-c", HANGING_SERVER, *paths], stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2]
    )
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    entered = threading.Event()

    def kill_when_entered() -> None:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() == "entered":
            entered.set()
            proc.kill()  # SIGKILL: a crash, with the call in flight

    killer = threading.Thread(target=kill_when_entered, daemon=True)
    killer.start()
    _isolate(tmp_path, monkeypatch)
    write_config(tmp_path, pki, f"127.0.0.1:{port}", monkeypatch)
    try:
        yield Hanging(entered)
    finally:
        proc.kill()
        proc.wait(10)
        killer.join(10)


@pytest.fixture(scope="module")
def pki() -> Pki:
    return make_pki()


def test_a_write_cut_off_mid_call_may_have_been_applied(hanging: Hanging) -> None:
    r = CliRunner().invoke(cli, ["cmd", "run", "n1", "inventory.refresh"])
    assert hanging.entered.is_set(), "the call never reached the server"
    assert r.exit_code == 5, r.output
    assert "it may have been applied; check with `bc cmd list --node NODE`" in r.output, r.output
    assert "cannot reach" not in r.output


def test_a_read_cut_off_mid_call_is_just_unavailable(hanging: Hanging) -> None:
    r = CliRunner().invoke(cli, ["nodes"])
    assert hanging.entered.is_set()
    assert r.exit_code == 5, r.output
    assert "may have been applied" not in r.output


def test_nothing_listening_is_cannot_reach_not_maybe_applied(
    tmp_path: Path, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _isolate(tmp_path, monkeypatch)
    write_config(tmp_path, pki, f"127.0.0.1:{port}", monkeypatch)
    r = CliRunner().invoke(cli, ["cmd", "run", "n1", "inventory.refresh"])
    assert r.exit_code == 5, r.output
    assert "is not answering (connection refused)" in r.output and "may have been applied" not in r.output


def test_every_write_rpc_names_its_check() -> None:
    writes = [m.name for m in admin_pb2.DESCRIPTOR.services_by_name["Admin"].methods if is_write(m.name)]
    assert writes, "no write rpcs found"
    assert sorted(set(writes) - set(WRITE_CHECKS)) == []


@pytest.mark.parametrize(
    "code, details, broke",
    [
        (grpc.StatusCode.UNAVAILABLE, "Stream removed (Socket closed)", True),
        (grpc.StatusCode.UNAVAILABLE, "recvmsg:Connection reset by peer", True),
        (grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses; last error: Socket closed", False),
        (grpc.StatusCode.UNAVAILABLE, "the store is unavailable", False),
        (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", True),
        (grpc.StatusCode.INVALID_ARGUMENT, "Socket closed", False),
    ],
)
def test_what_counts_as_broken_mid_call(code: grpc.StatusCode, details: str, broke: bool) -> None:
    assert broke_mid_call(code, details) is broke
