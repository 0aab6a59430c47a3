"""The agent's gRPC channels to its gateways: one per address, kept across dials, and the credentials they use.

A dial used to build credentials from the key pair read anew, open a new channel, and close it when the
channel was not ready within the address's timeout. In a reconnect storm that is a collapse: every channel
closed just before its TLS handshake finished cost the gateway that handshake for nothing and queued a new
one behind the rest, and the node's own process spent itself creating and closing channels (a channel costs
about a millisecond of the event loop to create). Measured at 10,000 nodes on three gateways: no session in
five minutes while each gateway sat at 12 % of a core (docs/fleet.md).

So a channel is closed only when it cannot be used any more:

* its handshake goes on after a dial stopped waiting for it (the next dial finds it further along, or READY);
* a stream that ended leaves it open (a refusal with a retry-after comes back over the same connection,
  with no new handshake);
* once a session opens on one address, the channels to the others are closed (a node holds one connection);
* new credentials (a renewed certificate: the key pair's files changed, or a TPM identity's new session
  certificate: `MemoryPair`) close them all.

grpc reconnects a kept channel itself, within `grpc.max_reconnect_backoff_ms` (2 s, in the channel options).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import grpc

from bc.wire.tls import channel_credentials

FileMark = tuple[int, int, int, int]
"""What says a file changed without reading it: inode, size, mtime and ctime (ns)."""


def file_mark(path: Path) -> FileMark:
    st = os.stat(path)
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass
class KeyPair:
    """The node's key pair, read again only when its files changed (two stats a dial instead of two reads)."""

    key_path: Path
    cert_path: Path
    marks: tuple[FileMark, FileMark] | None = None

    def changed(self) -> tuple[bytes, bytes] | None:
        """The pair (key, cert) if its files changed since the last call (always on the first), else None.
        Blocking file I/O: called through the agent's offload."""
        marks = (file_mark(self.key_path), file_mark(self.cert_path))
        if marks == self.marks:
            return None
        pair = self.key_path.read_bytes(), self.cert_path.read_bytes()
        # Marked after the read: a write between the stats and the reads is seen at the next dial.
        self.marks = marks
        return pair


class PairSource(Protocol):
    """Where a dial's TLS key pair comes from: `changed()` gives (key PEM, certificate PEM) when it is new since
    the last call (the first call included), else None. Blocking calls allowed: the dial runs it through its
    offload."""

    def changed(self) -> tuple[bytes, bytes] | None: ...


class MemoryPair:
    """A pair held in memory (a TPM identity's session key and certificate, `agent.session_key`): `current()`
    gives it, or None before the first one, and each new pair is told apart from the last by identity."""

    def __init__(self, current: Callable[[], tuple[bytes, bytes] | None]) -> None:
        self.current = current
        self._last: tuple[bytes, bytes] | None = None

    def changed(self) -> tuple[bytes, bytes] | None:
        pair = self.current()
        if pair is None or pair is self._last or pair == self._last:
            return None
        self._last = pair
        return pair


ChannelFactory = Callable[[str, grpc.ChannelCredentials], grpc.aio.Channel]


class Channels:
    """At most one channel per gateway address, under the current credentials."""

    def __init__(self, ca_pem: bytes, new_channel: ChannelFactory) -> None:
        self.ca_pem = ca_pem
        self.new_channel = new_channel
        self.creds: grpc.ChannelCredentials | None = None
        self.open: dict[str, grpc.aio.Channel] = {}
        self.created = 0  # channels made (telemetry, tests)

    async def use_pair(self, pair: tuple[bytes, bytes] | None) -> None:
        """New key pair (not None): new credentials, and every channel made with the old ones is closed."""
        if pair is None and self.creds is not None:
            return
        if pair is None:
            raise RuntimeError("no key pair read yet")
        await self.close_all()
        key_pem, cert_pem = pair
        self.creds = channel_credentials(self.ca_pem, key_pem, cert_pem)

    def get(self, addr: str) -> grpc.aio.Channel:
        """The channel to `addr`: the kept one, or a new one."""
        ch = self.open.get(addr)
        if ch is None:
            assert self.creds is not None, "use_pair() first"
            ch = self.new_channel(addr, self.creds)
            self.open[addr] = ch
            self.created += 1
        return ch

    async def keep_only(self, addr: str) -> None:
        """A session opens on `addr`: the other channels (handshakes still going, maybe) are not needed."""
        for other in [a for a in self.open if a != addr]:
            await self.open.pop(other).close()

    async def drop(self, addr: str) -> None:
        ch = self.open.pop(addr, None)
        if ch is not None:
            await ch.close()

    async def close_all(self) -> None:
        for addr in list(self.open):
            await self.drop(addr)
