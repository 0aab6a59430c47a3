"""A bound for the session stream: how many messages one gRPC bidi stream carries on this machine.

    python -m bench.echo serve PORT PKI_DIR     # the server, in a process of its own (as `bc serve` is)
    python -m bench.echo [--seconds 3] [--size 300] [--window 256]   # a whole measurement: server + client

The server echoes every message it reads on the stream; the client (another process) writes messages of
`size` bytes continuously with at most `window` unanswered and reads the echoes, for `seconds`. Both ends use
grpc.aio over 127.0.0.1 with mutual TLS (P-256 certificates from a throwaway CA), as the session does; the
messages are raw bytes (no protobuf), so this is gRPC's cost alone. `messages_per_s` counts both directions
(each echo is a message each way), as a command's messages are counted in both directions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import grpc

METHOD = "/bench.Echo/Echo"


def write_pki(root: Path) -> None:
    """A throwaway CA, a serving certificate for 127.0.0.1 and a client certificate, as PEM files in `root`."""
    from bc.pki import keys
    from bc.pki.ca import CertificateAuthority
    from bc.pki.secrets_source import SystemSecrets, p256_key
    from bc.seams.clock import SystemClock

    secrets = SystemSecrets()
    ca = CertificateAuthority.create(SystemClock(), random.Random(), secrets)
    server_key, client_key = p256_key(secrets), p256_key(secrets)
    root.mkdir(parents=True, exist_ok=True)
    (root / "ca.pem").write_bytes(ca.ca_pem)
    (root / "server.key").write_bytes(keys.key_to_pem(server_key))
    (root / "server.crt").write_bytes(keys.cert_to_pem(ca.issue_server_cert(["127.0.0.1"], server_key)))
    (root / "client.key").write_bytes(keys.key_to_pem(client_key))
    (root / "client.crt").write_bytes(keys.cert_to_pem(ca.issue_operator_cert("bench", client_key)))


async def _echo(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
    async for m in requests:
        yield m


async def serve(port: int, pki: Path) -> None:
    creds = grpc.ssl_server_credentials(
        [((pki / "server.key").read_bytes(), (pki / "server.crt").read_bytes())],
        root_certificates=(pki / "ca.pem").read_bytes(),
        require_client_auth=True,
    )
    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler("bench.Echo", {"Echo": grpc.stream_stream_rpc_method_handler(_echo)})
    server.add_generic_rpc_handlers((handler,))
    server.add_secure_port(f"127.0.0.1:{port}", creds)
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()


async def measure(port: int, pki: Path, seconds: float, size: int, window: int) -> dict[str, Any]:
    creds = grpc.ssl_channel_credentials(
        root_certificates=(pki / "ca.pem").read_bytes(),
        private_key=(pki / "client.key").read_bytes(),
        certificate_chain=(pki / "client.crt").read_bytes(),
    )
    async with grpc.aio.secure_channel(f"127.0.0.1:{port}", creds) as channel:
        call = channel.stream_stream(METHOD)()
        payload = b"x" * size
        room = asyncio.Semaphore(window)
        echoed = 0
        stop = False

        async def write() -> None:
            while not stop:
                await room.acquire()
                await call.write(payload)
            await call.done_writing()

        # A short warm-up (the handshake, the first frames), then the timed part.
        writer = asyncio.create_task(write())
        t_end = time.perf_counter() + 0.5
        while time.perf_counter() < t_end:
            await call.read()
            room.release()
        t0 = time.perf_counter()
        t_end = t0 + seconds
        while time.perf_counter() < t_end:
            await call.read()
            room.release()
            echoed += 1
        elapsed = time.perf_counter() - t0
        stop = True
        room.release()
        while await call.read() is not grpc.aio.EOF:  # drain what is still in flight
            room.release()
        await writer
    return {
        "message_bytes": size,
        "window": window,
        "round_trips_per_s": round(echoed / elapsed),
        "messages_per_s": round(2 * echoed / elapsed),
    }


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn_server(port: int, pki: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "bench.echo", "serve", str(port), str(pki)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
    )


async def echo_rate(workdir: Path, seconds: float = 3.0, size: int = 300, window: int = 256) -> dict[str, Any]:
    """Start the echo server in its own process, measure from this one, stop the server."""
    pki = workdir / "echo-pki"
    write_pki(pki)
    port = free_port()
    proc = spawn_server(port, pki)
    try:
        assert proc.stdout is not None
        line = await asyncio.to_thread(proc.stdout.readline)
        if line.strip() != "ready":
            raise RuntimeError(f"the echo server did not start (it said {line!r})")
        return await measure(port, pki, seconds, size, window)
    finally:
        proc.terminate()
        proc.wait(10)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "serve":
        asyncio.run(serve(int(argv[1]), Path(argv[2])))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--size", type=int, default=300)
    ap.add_argument("--window", type=int, default=256)
    args = ap.parse_args(argv)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="bc-bench-echo-") as tmp:
        print(json.dumps(asyncio.run(echo_rate(Path(tmp), args.seconds, args.size, args.window))))


if __name__ == "__main__":
    main()
