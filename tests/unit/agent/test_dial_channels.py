"""The agent's kept channels and credentials (agent.session.channels) and the dial's come-back rule (Rotation)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import cast

import grpc

from agent.session.channels import ChannelFactory, Channels, KeyPair
from agent.session.grpc_dial import STICKY_S, Rotation


class FakeChannel:
    def __init__(self, addr: str) -> None:
        self.addr = addr
        self.closed = False

    async def close(self) -> None:
        self.closed = True


def factory(made: list[FakeChannel]) -> ChannelFactory:
    """Channels that record their close, in `made` (the fake stands where a grpc.aio.Channel would)."""

    def new(addr: str, creds: grpc.ChannelCredentials) -> grpc.aio.Channel:
        ch = FakeChannel(addr)
        made.append(ch)
        return cast(grpc.aio.Channel, ch)

    return new


def test_the_key_pair_is_read_again_only_when_its_files_change(tmp_path: Path) -> None:
    key, cert = tmp_path / "node.key", tmp_path / "node.crt"
    key.write_bytes(b"k1")
    cert.write_bytes(b"c1")
    pair = KeyPair(key, cert)
    assert pair.changed() == (b"k1", b"c1")
    assert pair.changed() is None  # two stats, no read, no new credentials
    # A renewal writes new files and renames them into place (a new inode), as IdentityFile does.
    (tmp_path / "new.crt").write_bytes(b"c2")
    os.replace(tmp_path / "new.crt", cert)
    assert pair.changed() == (b"k1", b"c2")
    assert pair.changed() is None


async def test_one_channel_per_address_kept_across_dials_and_the_others_closed_once_one_is_used() -> None:
    made: list[FakeChannel] = []
    chans = Channels(b"ca", factory(made))
    await chans.use_pair((b"k", b"c"))
    a, b = chans.get("a:1"), chans.get("b:1")
    assert chans.get("a:1") is a and len(made) == 2  # the next dial finds the same channel, handshake and all
    made_a, made_b = made
    await chans.use_pair(None)  # the pair did not change: the channels stay
    assert not made_a.closed and not made_b.closed
    await chans.keep_only("b:1")
    assert made_a.closed and not made_b.closed
    assert chans.get("b:1") is b


async def test_a_new_key_pair_closes_every_channel_made_with_the_old_one() -> None:
    made: list[FakeChannel] = []
    chans = Channels(b"ca", factory(made))
    await chans.use_pair((b"k", b"c1"))
    old = chans.get("a:1")
    await chans.use_pair((b"k", b"c2"))
    assert made[0].closed
    assert chans.get("a:1") is not old and chans.created == 2


def test_a_refusal_with_a_retry_after_sends_the_next_dial_to_the_same_gateway() -> None:
    r = Rotation(["a:1", "b:1", "c:1"])
    r.connected("a:1", 0.0)
    r.come_back()  # refused RESOURCE_EXHAUSTED with a retry-after: it expects us then
    assert r.order(1.0)[0] == "a:1"
    r.connected("a:1", 2.0)
    assert r.order(3.0)[0] == "b:1"  # a short session without one still moves on
    r.connected("b:1", 4.0)
    assert r.order(4.0 + STICKY_S)[0] == "b:1"
