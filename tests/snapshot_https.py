"""A small HTTPS object store on 127.0.0.1 for the snapshot tests: real TLS under a bc CA, PUT and GET.

Paths: `PUT /o/NAME?sig=...` stores the body; `GET /o/NAME` serves it; `/to/NAME` answers a 307 to
`https://…/o/NAME` (a redirect that is followed); `/http/NAME` a 307 to `http://…/o/NAME` (refused);
`/hang/…` reads the request line and headers and then never answers nor reads (a stalled peer).
One request per connection (`Connection: close`).
"""

from __future__ import annotations

import asyncio
import random
import ssl
from pathlib import Path

from bc.pki import keys
from bc.pki.ca import CertificateAuthority
from bc.pki.secrets_source import SystemSecrets, p256_key
from bc.seams.clock import SystemClock


def pki(ca: CertificateAuthority | None = None) -> tuple[bytes, bytes, bytes]:
    """(ca_pem, server cert chain pem, server key pem) for 127.0.0.1, under `ca` (default: a new one)."""
    ca = ca or CertificateAuthority.create(SystemClock(), random.Random(1), SystemSecrets())
    key = p256_key(SystemSecrets())
    cert = ca.issue_server_cert(["127.0.0.1"], key)
    return ca.ca_pem, keys.cert_to_pem(cert) + ca.ca_pem, keys.key_to_pem(key)


class ObjectStore:
    def __init__(self, tmp: Path, ca: CertificateAuthority | None = None) -> None:
        self.ca_pem, chain, key = pki(ca)
        (tmp / "store-cert.pem").write_bytes(chain)
        (tmp / "store-key.pem").write_bytes(key)
        self._ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._ctx.load_cert_chain(tmp / "store-cert.pem", tmp / "store-key.pem")
        self.objects: dict[str, bytes] = {}
        self.requests: list[str] = []
        self.stored = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._hung: list[asyncio.StreamWriter] = []
        self.port = 0

    def url(self, path: str) -> str:
        return f"https://127.0.0.1:{self.port}{path}"

    async def start(self) -> ObjectStore:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self._ctx)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aenter__(self) -> ObjectStore:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def stop(self) -> None:
        for w in self._hung:
            w.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            head = (await r.readuntil(b"\r\n\r\n")).decode()
            line, *fields = head.split("\r\n")
            method, target, _ = line.split(" ", 2)
            headers = {k.lower(): v.strip() for k, _, v in (f.partition(":") for f in fields if f)}
            self.requests.append(f"{method} {target}")
            path = target.split("?", 1)[0]
            if path.startswith("/hang/"):
                self._hung.append(w)
                await asyncio.Event().wait()
            if path.startswith(("/to/", "/http/")):
                scheme = "https" if path.startswith("/to/") else "http"
                name = path.split("/", 2)[2]
                await self._answer(w, 307, b"", {"Location": f"{scheme}://127.0.0.1:{self.port}/o/{name}"})
                return
            name = path.removeprefix("/o/")
            if method == "PUT":
                body = await r.readexactly(int(headers.get("content-length", "0")))
                self.objects[name] = body
                self.stored.set()
                await self._answer(w, 200, b"")
            elif method == "GET" and name in self.objects:
                await self._answer(w, 200, self.objects[name])
            else:
                await self._answer(w, 404, b"")
        except (ConnectionError, ssl.SSLError, asyncio.IncompleteReadError):
            pass
        finally:
            if w not in self._hung:
                w.close()

    @staticmethod
    async def _answer(w: asyncio.StreamWriter, status: int, body: bytes, extra: dict[str, str] | None = None) -> None:
        lines = [f"HTTP/1.1 {status} X", f"Content-Length: {len(body)}", "Connection: close"]
        lines += [f"{k}: {v}" for k, v in (extra or {}).items()]
        w.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        await w.drain()
