"""Did `bc serve` refuse the operator's certificate, or is it just not there?

With TLS 1.3 the server checks the client's certificate after the client's side of the
handshake is done, so grpc reports a refused certificate exactly as a server that went away
mid-handshake: "Socket closed". Only a handshake of our own, with the operator's key pair,
tells them apart: a refused certificate comes back as a TLS alert (`certificate required`,
`bad certificate`, `unknown ca`) or, from grpc's server, as the end of the stream right after the
handshake, where a server that took it sends its HTTP/2 SETTINGS; a server that is down is a refused
or reset connection.

The key is handed to the `ssl` module through a 0600 file in a private temporary directory,
deleted at once (`ssl` loads key pairs from files only).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import ssl
from pathlib import Path

from bc.runtime.config import OperatorConfig

PROBE_TIMEOUT_S = 3.0
_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # and an empty SETTINGS
_ALERT = re.compile(r"(?:TLSV1_|TLSV13_|SSLV3_)?ALERT_([A-Z_]+)")


def _context(config: OperatorConfig, scratch: Path) -> ssl.SSLContext:
    cert, key = scratch / "operator.crt", scratch / "operator.key"
    cert.write_bytes(config.cert_pem)
    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(config.key_pem)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False  # the address may be an IP the certificate does not name; the CA still must sign it
    ctx.load_verify_locations(cadata=config.ca_pem.decode())
    ctx.load_cert_chain(cert, key)
    ctx.set_alpn_protocols(["h2"])
    return ctx


def alert_of(err: ssl.SSLError) -> str | None:
    """`certificate required` for `TLSV13_ALERT_CERTIFICATE_REQUIRED`; None when the error is no alert."""
    m = _ALERT.search(str(err.reason or "")) or _ALERT.search(str(err))
    return m.group(1).lower().replace("_", " ") if m else None


async def refused_certificate(config: OperatorConfig) -> str | None:
    """The server's TLS alert when it refuses the operator's certificate; None when it did not (or is down)."""
    import tempfile  # here: only a refused call probes, and it (shutil, bz2, lzma, random) is 4 ms of every start

    host, _, port = config.server.rpartition(":")
    with tempfile.TemporaryDirectory(prefix="bc-probe-") as tmp:
        try:
            ctx = _context(config, Path(tmp))
        except (OSError, ssl.SSLError, ValueError):
            return None
    writer = None
    try:
        async with asyncio.timeout(PROBE_TIMEOUT_S):
            reader, writer = await asyncio.open_connection(host.strip("[]"), int(port), ssl=ctx)
            writer.write(_PREFACE)
            await writer.drain()
            # The server's SETTINGS if it took the certificate; its alert, or the end of the stream, if not.
            if not await reader.read(1):
                return "it closed the connection after the TLS handshake"
    except ssl.SSLError as e:
        return alert_of(e)
    except (OSError, TimeoutError, ValueError):
        return None
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
    return None
