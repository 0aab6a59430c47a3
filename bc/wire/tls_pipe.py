"""TLS over a tunnel's frames, end to end between the operator's `bc` and the node (docs/access.md).

A tunnel's bytes cross a gateway, which must see ciphertext only and must not be able to alter them unseen.
So both ends speak TLS 1.3 over the frames (`ssl.SSLObject` on memory BIOs: no socket, any transport): the
node serves with its own certificate (the one its session presents), and the CLI accepts only a certificate
the cluster CA issued to the node it asked for (`bc.pki.identity.peer_identity`), checked after the handshake
because a node certificate is a client certificate (OpenSSL's own check would refuse its purpose). A frame
a relay altered, dropped or replayed breaks TLS's record MAC or sequence: `TunnelTampered`.

`SecureChannel` is the async adapter: `send(plaintext)` and `recv() -> plaintext | None`, over the two
callables that move ciphertext (`write(bytes)`, `read() -> bytes | None`).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

from cryptography import x509

from bc.errors import BcError, Unauthenticated
from bc.pki.identity import peer_identity

READ_CHUNK = 64 * 1024
"""Plaintext read from or written to TLS at once."""
FRAME_BYTES = 96 * 1024
"""The most ciphertext one frame carries (a relay refuses frames over 128 KiB: `bc.gateway.tunnels.MAX_FRAME`)."""


class TunnelTampered(BcError):
    """The tunnel's TLS failed: the peer is not who it should be, or a relay altered the stream."""


Write = Callable[[bytes], Awaitable[None]]
Read = Callable[[], Awaitable[bytes | None]]


def server_context(cert_file: Path, key_file: Path) -> ssl.SSLContext:
    """The node's side: its own certificate and key; the client is authorised by its ticket, not by TLS."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.load_cert_chain(str(cert_file), str(key_file))
    return ctx


def client_context() -> ssl.SSLContext:
    """The CLI's side: the peer's certificate is checked after the handshake (`check_node`)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def check_node(der: bytes | None, ca_cert: x509.Certificate, node_id: str, now: float) -> None:
    """Unauthenticated unless `der` is a certificate the cluster CA issued to node `node_id`, valid at `now`."""
    if not der:
        raise Unauthenticated(f"the tunnel's far end presented no certificate; it is not node {node_id}")
    peer = peer_identity(x509.load_der_x509_certificate(der), ca_cert, now=now)
    if peer.kind != "node" or peer.name != node_id:
        raise Unauthenticated(f"the tunnel's far end is {peer.kind} {peer.name!r}, not node {node_id!r}")


class SecureChannel:
    """One TLS connection over a tunnel's frames."""

    def __init__(self, ctx: ssl.SSLContext, write: Write, read: Read, *, server_side: bool) -> None:
        self._in, self._out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._tls = ctx.wrap_bio(self._in, self._out, server_side=server_side)
        self._write, self._read = write, read
        self.eof = False
        self.transport_closed = asyncio.Event()  # the frames ended (not just the peer's half-close)
        self._flushing = asyncio.Lock()

    async def _flush(self) -> None:
        # One flush at a time, taking the BIO's bytes under the lock: a read (TLS 1.3 writes from reads) and a
        # write may flush together, and their records must leave in the order TLS made them.
        async with self._flushing:
            data = self._out.read()
            for i in range(0, len(data), FRAME_BYTES):  # what piled up behind the lock goes in frames of a bounded size
                await self._write(data[i : i + FRAME_BYTES])

    async def _fill(self) -> bool:
        """More ciphertext from the peer; False at its end."""
        data = await self._read()
        if data is None:
            self._in.write_eof()
            self.transport_closed.set()
            return False
        self._in.write(data)
        return True

    async def handshake(self) -> None:
        while True:
            try:
                self._tls.do_handshake()
                await self._flush()
                return
            except ssl.SSLWantReadError:
                await self._flush()
                if not await self._fill():
                    raise TunnelTampered("the tunnel closed during its TLS handshake") from None
            except ssl.SSLError as e:
                await self._flush()
                raise TunnelTampered(f"the tunnel's TLS handshake failed: {e.reason or e}") from None

    def peer_der(self) -> bytes | None:
        return self._tls.getpeercert(binary_form=True)

    async def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = self._tls.write(view[:READ_CHUNK])
            view = view[n:]
            await self._flush()

    async def recv(self) -> bytes | None:
        """Plaintext from the peer; None once it closed cleanly (close_notify); TunnelTampered when its frames
        ended without that close (a truncation looks the same to TLS whoever made it)."""
        while True:
            try:
                data = self._tls.read(READ_CHUNK)
            except ssl.SSLWantReadError:
                await self._flush()  # TLS 1.3 writes session tickets and key updates from reads
                if self.eof:
                    return None
                if not await self._fill():
                    self.eof = True
                    raise TunnelTampered(
                        "the tunnel's stream ended before TLS's close: it was cut (by a relay, a revocation,"
                        " or its far end stopping)"
                    ) from None
                continue
            except ssl.SSLZeroReturnError:
                self.eof = True
                return None
            except ssl.SSLError as e:
                raise TunnelTampered(
                    f"the tunnel's TLS stream failed ({e.reason or e}): a relay altered, dropped or replayed its frames"
                ) from None
            if not data:
                self.eof = True
                return None
            await self._flush()
            return data

    async def close(self) -> None:
        """Send close_notify (best effort: the peer may be gone)."""
        try:
            self._tls.unwrap()
        except (ssl.SSLError, ValueError):
            pass
        await self._flush()
