"""logs.collect uploads to a real HTTP server on 127.0.0.1: the bytes arrive intact, and a 500 is upload-failed.

Uploads go only where the node's operator allowed (`bc node --upload-allow`): a URL outside the list is
never dialled, the command fails `forbidden-target`, and the tarball is kept in the data dir.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import any_pb2

from agent.hw.fake import FakeHardware
from agent.kinds import REGISTRY, KindContext
from agent.kinds.logs_collect import FORBIDDEN_TARGET, UPLOAD_FAILED
from agent.kinds.upload_allow import parse_prefixes
from bc.protocol.pb import kinds_pb2
from tests.http_server import serving

LOGS = REGISTRY["logs.collect"]


@dataclass
class Received:
    status: int = 200
    puts: list[tuple[str, dict[str, str], bytes]] = field(default_factory=list)


@pytest.fixture
def no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """httpx honours proxy variables; the uploads here must go straight to 127.0.0.1."""
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def upload_server(no_proxy: None) -> Iterator[tuple[str, Received]]:
    """An HTTP server in a thread that stores every PUT and answers `received.status`."""
    received = Received()

    class Handler(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.puts.append((self.path, dict(self.headers.items()), body))
            self.send_response(received.status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    with serving(Handler) as url:
        yield url, received


def context(tmp_path: Path, *allow: str) -> KindContext:
    log = tmp_path / "var" / "log" / "bc-node.log"
    log.parent.mkdir(parents=True)
    log.write_text("event=agent.started node=node-a\n" * 1000)
    hw = FakeHardware("hgx-h100-8", "node-a", state_dir=tmp_path / "data")

    async def summary() -> dict[str, Any]:
        return {"commands": 1}

    return KindContext(
        node_id="node-a",
        data_dir=tmp_path / "data",
        hw=hw,
        cdi_dir=tmp_path / "cdi",
        boot_id=hw.boot_id(),
        log_paths=[log],
        journal_summary=summary,
        upload_allow=parse_prefixes(allow),
    )


def payload(url: str) -> any_pb2.Any:
    a = any_pb2.Any()
    a.Pack(kinds_pb2.LogsCollectRequest(upload_url=url))
    return a


async def test_logs_are_uploaded_intact(tmp_path: Path, upload_server: tuple[str, Received]) -> None:
    base, received = upload_server
    ctx = context(tmp_path, f"{base}/upload/")
    res = await LOGS.run(ctx, LOGS.parse(payload(f"{base}/upload/node-a.tar.gz?sig=secret")))

    assert res.ok, res
    [(path, headers, body)] = received.puts
    assert path == "/upload/node-a.tar.gz?sig=secret"
    assert headers["Content-Type"] == "application/gzip" and int(headers["Content-Length"]) == len(body)
    assert body[:2] == b"\x1f\x8b"
    assert res.result["uploaded_to"] == f"{base}/upload/node-a.tar.gz"  # the signature is not in the result
    assert res.result["bytes"] == len(body)
    assert res.result["sha256"] == hashlib.sha256(body).hexdigest()
    assert not any((ctx.data_dir / "logs").iterdir())  # nothing kept once uploaded


async def test_a_server_error_is_upload_failed(tmp_path: Path, upload_server: tuple[str, Received]) -> None:
    base, received = upload_server
    received.status = 500
    ctx = context(tmp_path, f"{base}/upload")
    res = await LOGS.run(ctx, LOGS.parse(payload(f"{base}/upload")))
    assert (res.ok, res.reason) == (False, UPLOAD_FAILED)
    assert "500" in res.message and res.result == {"status": 500}
    assert len(received.puts) == 1
    assert not any((ctx.data_dir / "logs").iterdir())


@pytest.mark.usefixtures("no_proxy")
async def test_an_unreachable_server_is_upload_failed(tmp_path: Path) -> None:
    ctx = context(tmp_path, "http://127.0.0.1:1/")
    res = await LOGS.run(ctx, LOGS.parse(payload("http://127.0.0.1:1/upload")))
    assert (res.ok, res.reason) == (False, UPLOAD_FAILED)
    assert "127.0.0.1:1" in res.message


@pytest.mark.parametrize(
    "allow",
    [
        (),  # no --upload-allow at all
        ("{base}/elsewhere/",),  # the right server, another path
        ("{base}/up",),  # a prefix of the path's text, not of its segments
        ("https://{hostport}/upload/",),  # the right host and port over another scheme
    ],
)
async def test_an_upload_outside_the_allowlist_is_never_sent_and_the_tarball_is_kept(
    tmp_path: Path, upload_server: tuple[str, Received], allow: tuple[str, ...]
) -> None:
    base, received = upload_server
    hostport = base.removeprefix("http://")
    ctx = context(tmp_path, *(a.format(base=base, hostport=hostport) for a in allow))
    res = await LOGS.run(ctx, LOGS.parse(payload(f"{base}/upload/node-a.tar.gz?sig=secret")))

    assert (res.ok, res.reason) == (False, FORBIDDEN_TARGET)
    assert received.puts == []  # nothing was dialled
    assert f"{base}/upload/node-a.tar.gz" in res.message and "secret" not in res.message
    assert res.result["forbidden"] == f"{base}/upload/node-a.tar.gz"
    kept = Path(res.result["path"])
    assert kept.parent == ctx.data_dir / "logs" and kept.is_file()
    assert res.result["bytes"] == kept.stat().st_size
    assert res.result["sha256"] == hashlib.sha256(kept.read_bytes()).hexdigest()
