"""Helpers of the release-server security tests (issue 29): the release HTTPS server in a process of its
own on 127.0.0.1, as `bc serve --release-listen` runs it (so its file descriptors and memory are its own
to count in /proc), and the clients an attacker and a node would be.

`python -m tests.security.relserver_helpers ROOT [--write-stall S]` serves ROOT/releases with ROOT's
cert.pem and key.pem under the limits of `bc.api.release_limits` (a shorter write stall if asked), logs to
stderr and prints its port."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import logging
import os
import random
import socket
import ssl
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from bc.api.release_http import ReleaseServer
from bc.api.release_limits import ReleaseLimits
from bc.pki import keys
from bc.pki.ca import CertificateAuthority
from bc.pki.secrets_source import SystemSecrets, p256_key
from bc.seams.clock import SystemClock

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Served:
    proc: asyncio.subprocess.Process
    port: int
    ca_pem: bytes
    sha256: str
    size: int
    log: list[str]  # the server's stderr lines so far

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")

    async def wait_log(self, needle: str, timeout: float) -> str:
        """The first stderr line holding `needle` (polled each 50 ms up to `timeout`)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            for line in self.log:
                if needle in line:
                    return line
            await asyncio.sleep(0.05)
        raise AssertionError(f"no log line with {needle!r} in {timeout} s; got {self.log[-5:]}")


@asynccontextmanager
async def release_server(tmp: Path, size: int, write_stall_s: float | None = None) -> AsyncIterator[Served]:
    """A release of `size` random bytes served by a server process of its own on 127.0.0.1."""
    ca = CertificateAuthority.create(SystemClock(), random.Random(1), SystemSecrets())
    key = p256_key(SystemSecrets())
    (tmp / "cert.pem").write_bytes(keys.cert_to_pem(ca.issue_server_cert(["127.0.0.1"], key)) + ca.ca_pem)
    (tmp / "key.pem").write_bytes(keys.key_to_pem(key))
    data = random.Random(7).randbytes(size)
    sha = hashlib.sha256(data).hexdigest()
    (tmp / "releases").mkdir()
    (tmp / "releases" / sha).write_bytes(data)
    argv = [sys.executable, "-m", "tests.security.relserver_helpers", str(tmp)]
    if write_stall_s is not None:
        argv += ["--write-stall", str(write_stall_s)]
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=REPO,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    log: list[str] = []

    async def read_log(stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            log.append(line.decode(errors="replace").rstrip())

    reader = asyncio.create_task(read_log(proc.stderr))
    try:
        async with asyncio.timeout(30):
            port = int((await proc.stdout.readline()).decode() or "0")
        assert port, log
        yield Served(proc, port, ca.ca_pem, sha, size, log)
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        reader.cancel()


def client_context(ca_pem: bytes) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cadata=ca_pem.decode())
    return ctx


async def download(srv: Served, source: str = "127.0.0.1") -> bytes:
    """A node's download: connect, GET the release, read it to the end; the body."""
    r, w = await asyncio.open_connection("127.0.0.1", srv.port, ssl=client_context(srv.ca_pem), local_addr=(source, 0))
    try:
        w.write(f"GET /releases/{srv.sha256} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        await w.drain()
        head = await r.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 "), head
        return await r.readexactly(srv.size)
    finally:
        w.close()


def stalled_tcp(port: int, source: str) -> socket.socket:
    """A connection that sends nothing: not even a TLS ClientHello."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setblocking(False)
    s.bind((source, 0))
    s.connect_ex(("127.0.0.1", port))
    return s


async def stalled_tls(srv: Served, source: str) -> asyncio.StreamWriter | None:
    """A connection that finishes its TLS handshake and then sends nothing; None if the server closed it."""
    try:
        async with asyncio.timeout(10):
            _, w = await asyncio.open_connection(
                "127.0.0.1", srv.port, ssl=client_context(srv.ca_pem), local_addr=(source, 0)
            )
        return w
    except (OSError, ssl.SSLError, TimeoutError):
        return None


async def serve(root: Path, write_stall_s: float | None) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    limits = ReleaseLimits()
    if write_stall_s is not None:
        limits = dataclasses.replace(limits, write_stall_s=write_stall_s)
    srv = ReleaseServer(root / "releases", (root / "cert.pem").read_bytes(), (root / "key.pem").read_bytes(), limits)
    print(await srv.start("127.0.0.1", 0), flush=True)
    await asyncio.Future()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("root", type=Path)
    ap.add_argument("--write-stall", type=float, default=None)
    args = ap.parse_args()
    asyncio.run(serve(args.root, args.write_stall))
