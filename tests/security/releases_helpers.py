"""Shared by the self-update attack tests (tests/security/test_sec_releases_*.py): a lab node that runs a
confirmed release, releases signed as this tree's `bc release publish` signs them, crafted `daemon.upgrade`
offers, and what an offer came to.

The signatures and payloads follow the tree they run on (the statement its bc.pki.releases signs, the fields
its protos know), so on a tree without the fix each test fails for the reason it names, the attack going
through, and not for a missing name.
"""

from __future__ import annotations

import asyncio
import platform
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ed25519
from google.protobuf import json_format
from google.protobuf.message import Message

from agent.upgrade.slots import install, read_disk
from bc.pki import releases
from bc.protocol.pb import admin_pb2, kinds_pb2
from tests.integration.conftest import InprocLab
from tests.integration.test_self_update_inprocess import Node, until

KEY = ed25519.Ed25519PrivateKey.generate()
HERE = f"linux-{platform.machine()}".lower()
ELSEWHERE = "linux-aarch64" if HERE != "linux-aarch64" else "linux-x86_64"
SIGNED = ("name", "version", "sequence", "platform", "sha256", "size")


def binary(says: str, seed: str = "") -> bytes:
    """A release "binary": a script whose `--version` says `bc <says>`, padded with a comment."""
    pad = random.Random(seed or says).randbytes(20_000).hex()
    return f"#!/bin/sh\necho 'bc {says}'\nexit 0\n# {pad}\n".encode()


def sign(fields: dict[str, Any], key: ed25519.Ed25519PrivateKey = KEY) -> bytes:
    """The release key's signature of these fields, as this tree's publish makes it."""
    release = getattr(releases, "Release", None)
    if release is None:  # a tree whose signature covers the version, sha256 and size only
        return releases.sign(key, fields["version"], fields["sha256"], fields["size"])  # type: ignore[call-arg,arg-type]
    return releases.sign(key, release(**{k: fields[k] for k in SIGNED}))


def known(message: type[Message], fields: dict[str, Any]) -> dict[str, Any]:
    names = message.DESCRIPTOR.fields_by_name
    return {k: v for k, v in fields.items() if k in names}


@dataclass
class Build:
    """A release's signed fields, its signature, its bytes and where bc serve's release server has them."""

    fields: dict[str, Any]
    signature: bytes
    data: bytes
    url: str

    def offer(self, **over: Any) -> dict[str, Any]:
        return {**self.fields, "url": self.url, "signature": self.signature, **over}


def build(lab: InprocLab, version: str, sequence: int, *, says: str = "", on: str = HERE, seed: str = "") -> Build:
    """A release the key holder signed, its file put where bc serve serves releases (not stored as a record)."""
    data = binary(says or version, seed or f"{version}/{on}")
    from hashlib import sha256

    sha = sha256(data).hexdigest()
    kept = lab.server.opts.data_dir / "releases"
    kept.mkdir(parents=True, exist_ok=True)
    (kept / sha).write_bytes(data)
    fields = {"name": "bc", "version": version, "sequence": sequence, "platform": on, "sha256": sha, "size": len(data)}
    return Build(fields, sign(fields), data, f"{lab.server.release_url}/releases/{sha}")


async def publish(lab: InprocLab, version: str, tmp: Path, *, says: str = "") -> admin_pb2.ReleaseInfo:
    """`bc release publish` of a release whose binary says `bc <says>` (default: its version)."""
    data = binary(says or version)
    path = tmp / f"bc-{version}-{HERE}"
    path.write_bytes(data)
    sha, size = releases.file_digest(path)
    listed = await lab.admin.list_releases()
    sequence = getattr(listed, "next_sequence", 0) or len(listed.releases) + 1
    fields = {"name": "bc", "version": version, "sequence": sequence, "platform": HERE, "sha256": sha, "size": size}
    header = admin_pb2.PublishReleaseChunk(
        **known(admin_pb2.PublishReleaseChunk, {**fields, "signature": sign(fields)})
    )
    return await lab.admin.publish_release(header, path)


def offer_of(info: admin_pb2.ReleaseInfo, **over: Any) -> dict[str, Any]:
    """A published release's daemon.upgrade fields, with `over` changed."""
    fields = {k: getattr(info, k, "") for k in (*SIGNED, "url", "signature")}
    return {**fields, **over}


def payload_json(fields: dict[str, Any]) -> str:
    req = kinds_pb2.DaemonUpgradeRequest(**known(kinds_pb2.DaemonUpgradeRequest, fields))
    return json_format.MessageToJson(req, indent=None)


@dataclass(frozen=True)
class Outcome:
    swapped: bool
    state: str = ""
    reason: str = ""
    message: str = ""
    result_json: str = ""


async def offer(lab: InprocLab, node: Node, fields: dict[str, Any], timeout: float = 30.0) -> Outcome:
    """Run daemon.upgrade with these fields: its settled outcome, or `swapped` when the node restarted onto it."""
    cmd = await lab.admin.run_command("n1", "daemon.upgrade", payload_json=payload_json(fields))
    settled = asyncio.ensure_future(lab.wait_event("command.settled", lambda ev, d: ev.subject == cmd.id, timeout))
    swapped = asyncio.ensure_future(node.restarted.wait())
    try:
        await asyncio.wait({settled, swapped}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (settled, swapped):
            t.cancel()
    if node.restarted.is_set():
        return Outcome(swapped=True)
    done = await lab.admin.get_command(cmd.id)
    return Outcome(False, done.state, done.reason, done.message, done.result_json)


def slots_now(node: Node) -> dict[str, bytes]:
    """What the node would run: where `current` points and the bytes of each slot (the record aside)."""
    d = node.install_dir
    return {
        p.name: (str(p.readlink()).encode() if p.is_symlink() else p.read_bytes())
        for p in sorted(d.iterdir())
        if p.name != "upgrade.json"
    }


async def running_release(lab: InprocLab, tmp: Path) -> tuple[Node, admin_pb2.ReleaseInfo, admin_pb2.ReleaseInfo]:
    """n1 installed with 1.0.0, then upgraded to 1.2.0 (sequence 2), confirmed: it runs sequence 2.
    Also published: 1.1.0 (sequence 1), an older release the key really signed."""
    await lab.admin.add_release_key(releases.public_bytes(KEY))
    await until("the release key in the server's bundle", lambda: bool(lab.server.intent.release_keys))
    old = await publish(lab, "1.1.0", tmp)
    new = await publish(lab, "1.2.0", tmp)
    assert (old.sequence, new.sequence) == (1, 2)
    await lab.join("n1")
    node = Node(lab, "n1")
    install(node.install_dir, binary("1.0.0"), version="1.0.0")
    agent = node.start("1.0.0")
    await until("the release key on the node", lambda: bool(agent.trust.bundle.release_keys))
    assert (await offer(lab, node, offer_of(new))).swapped
    await node.restart_after_swap()
    node.start("1.2.0")
    await until("1.2.0 confirmed", lambda: read_disk(node.install_dir).record.state == "confirmed", 30)
    record = read_disk(node.install_dir).record
    assert (record.floor, read_disk(node.install_dir).current) == (2, "b")
    return node, old, new
