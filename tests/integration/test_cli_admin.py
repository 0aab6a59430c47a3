"""The admin CLI against a real gRPC server over mutual TLS on 127.0.0.1.

The server is a fake `AdminServicer` with canned replies (a fake at the seam:
what is under test is the client, the CLI's rendering and its errors, not the
control plane). It runs as a sync `grpc.server` on its own threads, because
the CLI under `CliRunner` runs `asyncio.run` on the test's thread.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import socket
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from click.testing import CliRunner, Result
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from bc.cli.main import cli
from bc.errors import NotFound
from bc.protocol.pb import admin_pb2, common_pb2
from bc.runtime.config import OperatorConfig
from bc.wire.status import error_to_status
from bc.wire.stubs import admin_pb2_grpc

# -- a throwaway PKI ----------------------------------------------------------------


@dataclass
class Pki:
    ca_pem: bytes
    server_key_pem: bytes
    server_cert_pem: bytes
    operator_key_pem: bytes
    operator_cert_pem: bytes


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Certificate | None,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    server: bool = False,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer.subject if issuer else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=1))
    )
    if issuer is None:
        builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    else:
        builder = builder.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if server:
        sans: list[x509.GeneralName] = [
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.DNSName("localhost"),
        ]
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def make_pki() -> Pki:
    ca_key = _key()
    ca = _cert("bc test CA", ca_key, None, ca_key)
    server_key, operator_key = _key(), _key()
    pem = serialization.Encoding.PEM
    return Pki(
        ca_pem=ca.public_bytes(pem),
        server_key_pem=_key_pem(server_key),
        server_cert_pem=_cert("bc serve", server_key, ca, ca_key, server=True).public_bytes(pem),
        operator_key_pem=_key_pem(operator_key),
        operator_cert_pem=_cert("operator", operator_key, ca, ca_key).public_bytes(pem),
    )


@pytest.fixture(scope="module")
def pki() -> Pki:
    return make_pki()


# -- the fake Admin service ------------------------------------------------------------

_NODES = {
    "n1": admin_pb2.NodeInfo(
        node_id="n1",
        role="node",
        state="connected",
        generation=4,
        applied_generation=4,
        observed_generation=3,
        last_seen_age_ms=3_000,
        session_epoch=2,
        gateway_id="gw-1",
        boot_id="boot-1",
        journal_id="journal-1",
        spec_hash="sha256:abc",
        state_age_ms=300_000,
        capabilities=["cdi", "mig"],
        sections=[
            common_pb2.SectionStatus(section="devices", state=common_pb2.PROGRESSING, generation=3, reason="Applying")
        ],
        conditions=[common_pb2.Condition(type="Ready", status="True", reason="Ok", age_ms=60_000)],
        inventory=common_pb2.Inventory(
            hostname="h1",
            source="fake:hgx-h100-8",
            gpus=[
                common_pb2.Gpu(index=0, uuid="GPU-0", name="H100", memory_mib=81920, healthy=True),
                common_pb2.Gpu(
                    index=1,
                    uuid="GPU-1",
                    name="H100",
                    memory_mib=81920,
                    healthy=True,
                    mig_enabled=True,
                    mig_instances=[common_pb2.MigInstance(gi=1, ci=0, uuid="MIG-1", profile="1g.10gb")],
                ),
            ],
        ),
    ),
    "n2": admin_pb2.NodeInfo(node_id="n2", role="node", state="new", last_seen_age_ms=-1),
}


class FakeAdmin(admin_pb2_grpc.AdminServicer):
    """Canned answers; records the requests it was sent."""

    def __init__(self) -> None:
        self.requests: list[Any] = []

    def _node(self, node_id: str, context: Any) -> admin_pb2.NodeInfo:
        if node_id not in _NODES:
            context.abort(*error_to_status(NotFound(f"no node named {node_id}")))
        return _NODES[node_id]

    def CreateToken(self, request: Any, context: Any) -> admin_pb2.CreateTokenResponse:
        self.requests.append(request)
        return admin_pb2.CreateTokenResponse(
            token="bc1.tok-id.secret.pin",
            token_id="tok-id",
            node_id=request.node_id,
            expires_at_ms=1_700_000_000_000,
        )

    def ListNodes(self, request: Any, context: Any) -> admin_pb2.ListNodesResponse:
        return admin_pb2.ListNodesResponse(nodes=list(_NODES.values()))

    def GetNode(self, request: Any, context: Any) -> admin_pb2.NodeInfo:
        return self._node(request.node_id, context)

    def GetSpec(self, request: Any, context: Any) -> admin_pb2.SpecInfo:
        node = self._node(request.node_id, context)
        return admin_pb2.SpecInfo(
            node_id=node.node_id,
            generation=node.generation,
            spec_hash=node.spec_hash,
            spec_json='{"telemetry":{"interval_s":30}}',
        )

    def SetSpecSection(self, request: Any, context: Any) -> admin_pb2.SpecInfo:
        self.requests.append(request)
        node = self._node(request.node_id, context)
        return admin_pb2.SpecInfo(node_id=node.node_id, generation=node.generation + 1, spec_hash="sha256:new")

    def Reserve(self, request: Any, context: Any) -> admin_pb2.Reservation:
        self.requests.append(request)
        devices = [
            admin_pb2.BookedDevice(device_class="gpu", atom_id=f"gpu/{i}", gpu_uuid=f"GPU-{i}")
            for i in range(request.gpus)
        ]
        return admin_pb2.Reservation(
            id="r-1",
            node_id=request.node_id or "n1",
            device_class=request.device_class,
            gpus=request.gpus,
            state="placed",
            devices=devices,
            generation=5,
            binding=request.binding,
        )

    def Release(self, request: Any, context: Any) -> admin_pb2.Reservation:
        return admin_pb2.Reservation(id=request.reservation_id, node_id="n1", state="releasing")

    def ListReservations(self, request: Any, context: Any) -> admin_pb2.ListReservationsResponse:
        self.requests.append(request)
        r = admin_pb2.Reservation(
            id="r-1", node_id="n1", device_class="gpu", gpus=2, state="active", created_age_ms=120_000
        )
        return admin_pb2.ListReservationsResponse(reservations=[r])

    def ListEvents(self, request: Any, context: Any) -> admin_pb2.ListEventsResponse:
        self.requests.append(request)
        return admin_pb2.ListEventsResponse(events=_EVENTS)

    def Watch(self, request: Any, context: Any) -> Iterator[admin_pb2.EventRecord]:
        # The real Watch never ends; this one ends after its history so the CLI's follow returns.
        yield from (e for e in _EVENTS if e.seq > request.after_seq)

    def ServerInfo(self, request: Any, context: Any) -> admin_pb2.ServerInfoResponse:
        return admin_pb2.ServerInfoResponse(version="test", store="sqlite")

    def GetUsage(self, request: Any, context: Any) -> admin_pb2.UsageResponse:
        return admin_pb2.UsageResponse()  # nothing recorded yet: `bc nodes show` reads it for its USAGE block


_EVENTS = [
    admin_pb2.EventRecord(seq=1, type="node.joined", subject="n1", data_json='{"role":"node"}', at_ms=0),
    admin_pb2.EventRecord(seq=2, type="node.status", subject="n1", data_json='{"state":"connected"}', at_ms=1000),
]


@dataclass
class Server:
    port: int
    admin: FakeAdmin


@pytest.fixture
def server(pki: Pki) -> Iterator[Server]:
    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    admin = FakeAdmin()
    register: Any = admin_pb2_grpc.add_AdminServicer_to_server  # generated, untyped
    register(admin, srv)
    creds = grpc.ssl_server_credentials(
        [(pki.server_key_pem, pki.server_cert_pem)], root_certificates=pki.ca_pem, require_client_auth=True
    )
    port = srv.add_secure_port("127.0.0.1:0", creds)
    srv.start()
    try:
        yield Server(port, admin)
    finally:
        srv.stop(None)


def write_config(tmp_path: Path, pki: Pki, server: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = OperatorConfig.write(
        tmp_path / "operator",
        server=server,
        ca_pem=pki.ca_pem,
        cert_pem=pki.operator_cert_pem,
        key_pem=pki.operator_key_pem,
        data_dir=tmp_path / "server",
    )
    monkeypatch.setenv("BC_CONFIG", str(path))
    return path


@pytest.fixture
def operator(tmp_path: Path, pki: Pki, server: Server, monkeypatch: pytest.MonkeyPatch) -> Server:
    """The CLI configured to reach `server`, with nothing else to find."""
    _isolate(tmp_path, monkeypatch)
    write_config(tmp_path, pki, f"127.0.0.1:{server.port}", monkeypatch)
    return server


def _isolate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("BC_DATA_DIR", raising=False)
    monkeypatch.delenv("BC_CONFIG", raising=False)
    monkeypatch.delenv("BC_DEBUG", raising=False)


def bc(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), prog_name="bc")


def ok_json(*args: str) -> Any:
    result = bc(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


# -- what an operator sees ------------------------------------------------------------------


def test_nodes_json_lists_every_node_with_integer_generations(operator: Server) -> None:
    doc = ok_json("nodes")
    assert [n["node_id"] for n in doc] == ["n1", "n2"]
    assert doc[0]["generation"] == 4 and doc[0]["observed_generation"] == 3
    assert doc[1]["last_seen_age_ms"] == -1
    assert doc[1]["generation"] == 0  # defaults are printed, not omitted


def test_nodes_table(operator: Server) -> None:
    result = bc("nodes")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["NODE", "ROLE", "STATE", "GEN", "APPLIED", "OBSERVED", "LAST", "SEEN", "FLAGS"]
    assert lines[1].split() == ["n1", "node", "connected", "4", "4", "3", "3s", "ago", "-"]
    assert lines[2].split()[-2] == "never"


def test_nodes_show_json_has_the_smoke_contract_keys_in_order(operator: Server) -> None:
    doc = ok_json("nodes", "show", "n1")
    assert doc["state"] == "connected"
    assert doc["generation"] == 4 and doc["observed_generation"] == 3
    keys = list(doc)
    # A deep search for `generation` must meet the node's before any section's.
    assert keys.index("generation") < keys.index("sections")
    assert doc["sections"][0]["state"] == "PROGRESSING"
    assert doc["inventory"]["gpus"][1]["memory_mib"] == 81920


def test_nodes_show_human(operator: Server) -> None:
    result = bc("nodes", "show", "n1")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "connected for 5m" in out
    assert "4 (applied 4, observed 3)" in out
    assert "SECTIONS" in out and "progressing" in out
    assert "CONDITIONS" in out and "Ready" in out
    assert "GPU-1" in out and "80 GiB" in out and "1g.10gb" in out


def test_reserve_json_has_the_reservation_id_first(operator: Server) -> None:
    doc = ok_json("reserve", "--gpus", "2", "--node", "n1")
    assert next(iter(doc)) == "id" and doc["id"] == "r-1"
    assert [d["atom_id"] for d in doc["devices"]] == ["gpu/0", "gpu/1"]
    req = operator.admin.requests[-1]
    assert (req.gpus, req.node_id, req.device_class, req.binding) == (2, "n1", "gpu", "hold")


def test_reserve_and_release_human(operator: Server) -> None:
    result = bc("reserve", "--gpus", "2", "--node", "n1", "--class", "gpu")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "reservation r-1 on n1: gpu/0, gpu/1"
    result = bc("release", "r-1")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "reservation r-1 on n1: releasing"


def test_reservations_table(operator: Server) -> None:
    result = bc("reservations", "--node", "n1", "--all")
    assert result.exit_code == 0, result.output
    # Issue 13 adds the window, the tenant and the reason a reservation waits.
    row = ["r-1", "n1", "gpu", "2", "active", "2m", "ago", "-", "open", "-", "-"]
    assert result.stdout.splitlines()[1].split() == row
    req = operator.admin.requests[-1]
    assert req.node_id == "n1" and req.include_released


def test_token_create_prints_the_token_alone_on_the_last_line(operator: Server) -> None:
    result = bc("token", "create", "--node-id", "n1", "--role", "node", "--ttl", "10m")
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    assert lines[-1] == "bc1.tok-id.secret.pin"
    assert lines[0] == "join token for n1 (role node), expires in 10m, one use:"
    assert operator.admin.requests[-1].ttl_s == 600


def test_token_create_json(operator: Server) -> None:
    doc = ok_json("token", "create", "--node-id", "n1")
    assert doc == {
        "token": "bc1.tok-id.secret.pin",
        "token_id": "tok-id",
        "node_id": "n1",
        "expires_at_ms": 1_700_000_000_000,
    }
    assert operator.admin.requests[-1].ttl_s == 3600


def test_bad_ttl_is_a_usage_error_before_any_call(operator: Server) -> None:
    result = bc("token", "create", "--node-id", "n1", "--ttl", "soon")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: the --ttl 'soon' is not a duration")
    assert operator.admin.requests == []


def test_spec_show_and_set(operator: Server, tmp_path: Path) -> None:
    doc = ok_json("spec", "show", "n1")
    assert doc == {
        "node_id": "n1",
        "generation": 4,
        "spec_hash": "sha256:abc",
        "spec": {"telemetry": {"interval_s": 30}},
    }
    human = bc("spec", "show", "n1")
    assert human.stdout.splitlines()[0] == "node n1 generation 4 hash sha256:abc"
    assert json.loads("\n".join(human.stdout.splitlines()[1:])) == {"telemetry": {"interval_s": 30}}

    section = tmp_path / "telemetry.json"
    section.write_text('{"interval_s": 10}\n')
    result = bc("spec", "set", "n1", "telemetry", f"@{section}")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "node n1 generation 5 hash sha256:new"
    req = operator.admin.requests[-1]
    assert (req.node_id, req.section, json.loads(req.section_json)) == ("n1", "telemetry", {"interval_s": 10})


def test_spec_set_with_bad_json_fails_locally(operator: Server) -> None:
    result = bc("spec", "set", "n1", "telemetry", "{not json")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: the telemetry section is not valid JSON: ")
    assert operator.admin.requests == []


def test_events_list_and_follow(operator: Server) -> None:
    doc = ok_json("events", "--type", "node.")
    assert [e["seq"] for e in doc] == [1, 2]
    assert doc[1]["data"] == {"state": "connected"}
    assert operator.admin.requests[-1].type_prefix == "node."

    table = bc("events")
    assert table.stdout.splitlines()[2].split()[:4] == ["2", "1970-01-01T00:00:01Z", "node.status", "n1"]

    follow = bc("events", "--follow", "--after", "1", "--json")
    assert follow.exit_code == 0, follow.output
    lines = follow.stdout.splitlines()
    assert [json.loads(line)["seq"] for line in lines] == [2]


# -- errors: one sentence, the right exit code, never a traceback --------------------------


def test_not_found_from_the_server_exits_3(operator: Server) -> None:
    result = bc("nodes", "show", "n9")
    assert result.exit_code == 3
    assert result.stderr == "error: no node named n9\n"
    assert result.stdout == ""
    assert "Traceback" not in result.output


def test_debug_adds_the_traceback(operator: Server) -> None:
    result = bc("--debug", "nodes", "show", "n9")
    assert result.exit_code == 3
    assert "Traceback" in result.stderr
    assert result.stderr.rstrip().endswith("error: no node named n9")


def test_no_operator_config_exits_2_with_one_sentence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _isolate(tmp_path, monkeypatch)
    result = bc("nodes")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: no operator config found")
    assert "run `bc serve` first" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_server_not_listening_exits_5(tmp_path: Path, pki: Pki, monkeypatch: pytest.MonkeyPatch) -> None:
    _isolate(tmp_path, monkeypatch)
    # A bound socket that never listens: connecting to it is refused for as long as the test holds it.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{sock.getsockname()[1]}"
        write_config(tmp_path, pki, address, monkeypatch)
        result = bc("reserve", "--gpus", "1", "--json")
    assert result.exit_code == 5
    assert result.stderr.strip() == f"error: bc serve at {address} is not answering (connection refused)"
    assert result.stdout == ""


def test_a_server_from_another_ca_is_refused_with_exit_6(
    tmp_path: Path, pki: Pki, server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    _isolate(tmp_path, monkeypatch)
    stranger = make_pki()
    # The operator trusts a different CA than the one that signed the server.
    path = OperatorConfig.write(
        tmp_path / "operator",
        server=f"127.0.0.1:{server.port}",
        ca_pem=stranger.ca_pem,
        cert_pem=stranger.operator_cert_pem,
        key_pem=stranger.operator_key_pem,
        data_dir=tmp_path,
    )
    monkeypatch.setenv("BC_CONFIG", str(path))
    result = bc("nodes")
    assert result.exit_code == 6, result.output
    assert result.stderr.startswith("error: the TLS handshake with bc serve at")


def test_click_usage_errors_keep_exit_2(operator: Server) -> None:
    result = bc("reserve", "--gpus", "0")
    assert result.exit_code == 2
    assert "Traceback" not in result.output


def test_version() -> None:
    result = bc("--version")
    assert result.exit_code == 0
    assert result.stdout.startswith("bc ")


def test_nodes_json_flag_may_come_before_show(operator: Server) -> None:
    result = bc("nodes", "--json", "show", "n1")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["node_id"] == "n1"
