"""Release keys and signed release records: `bc release key add`, `bc release publish`, `bc release status`.

A release is stored only when its signature verifies under a release key
already added (over name, version, sequence, platform, sha256 and size:
bc.pki.releases.Release), and (when `bc serve` keeps the file) when the
uploaded bytes have the sha256 and size the signature covers. Its sequence
is assigned here: it must be the next of its name, one above every earlier
release of that name, which `bc release publish` asked for before signing;
a publish that lost a race to another is refused, never renumbered (the
signature covers the number). Nothing is stored for a release that fails any
check, and the uploaded file is removed. A row signed the old way (empty
platform, migration 0020) is replaced by a new publish of its version.

Release keys reach nodes in the trust bundle (`Intent.set_release_keys`);
nodes take a new one only under a command-signing root's own signature
(agent.trust): each key is stored with the root's endorsement of it, made by
`bc serve` when it holds the root, else on the operator's machine (`bc release
key add --root-key FILE`) and checked here; without either, a new key is
refused in one sentence rather than stored for nodes to refuse.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric import ed25519
from google.protobuf.message import DecodeError

from bc.control.base import actor
from bc.control.base.bus import Bus
from bc.control.base.events import publish as publish_event
from bc.errors import Conflict, UsageError
from bc.pki import releases as rel
from bc.protocol.pb import common_pb2, kinds_pb2, session_pb2
from bc.runtime.files import fsync_dir
from bc.store import releases as sql
from bc.store.base import Row, Store


@dataclass(frozen=True)
class ReleaseHeader:
    version: str
    sha256: str
    size: int
    signature: bytes
    url: str = ""
    name: str = rel.DEFAULT_NAME
    sequence: int = 0
    platform: str = ""

    @property
    def release(self) -> rel.Release:
        return rel.Release(
            self.name or rel.DEFAULT_NAME, self.version, self.sequence, self.platform, self.sha256, self.size
        )


async def release_keys(store: Store) -> list[bytes]:
    async with store.transaction(write=False) as tx:
        return [bytes(r["public_key"]) for r in await sql.list_keys(tx)]


async def endorsements(store: Store) -> list[common_pb2.ReleaseKeyEndorsement]:
    """The root's signature of each release key that has one (`TrustBundle.release_key_endorsements`)."""
    async with store.transaction(write=False) as tx:
        rows = await sql.list_keys(tx)
    return [
        common_pb2.ReleaseKeyEndorsement(public_key=bytes(r["public_key"]), root_signature=bytes(r["root_signature"]))
        for r in rows
        if r["root_signature"]
    ]


ROOT_OFFLINE = (
    "the command-signing root key is not on this host, and nodes take a new release key only under its"
    " signature: pass --root-key FILE (the file `bc pki root export` wrote) to bc release key add; it signs"
    " the key there and is never sent"
)


@dataclass(frozen=True)
class RootAtHand:
    """What `add_key` may endorse a new key with: the root's public key, its private key when on this host."""

    public: ed25519.Ed25519PublicKey
    private: ed25519.Ed25519PrivateKey | None


async def add_key(
    store: Store, bus: Bus | None, public_key: bytes, *, root: RootAtHand | None = None, root_signature: bytes = b""
) -> Row:
    """Add a release key, endorsed by the root (`bc.pki.releases.endorse`) when the install signs (`root`).

    The endorsement is made here when the root key is on this host, else it must come with the request
    (`root_signature`, made where the exported root is) and verify under the root: nodes would refuse a
    worker-signed bundle bringing a key without one, silently to the operator. A key already stored is
    left as it is."""
    if len(public_key) != 32:
        raise UsageError(f"a release key is a raw Ed25519 public key of 32 bytes, not {len(public_key)}")
    key_id = rel.key_id(public_key)
    endorsement: bytes | None = None
    if root is not None:
        if root_signature:
            if not rel.endorsed_by(root.public, public_key, root_signature):
                raise UsageError(
                    "the root signature sent with the release key does not verify under this install's"
                    " command-signing root; nothing changed"
                )
            endorsement = root_signature
        elif root.private is not None:
            endorsement = rel.endorse(root.private, public_key)
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        known = any(r["key_id"] == key_id for r in await sql.list_keys(tx))
        if root is not None and endorsement is None and not known:
            raise UsageError(ROOT_OFFLINE)
        if await sql.add_key(tx, key_id, public_key, actor.current(), now_ms, endorsement):
            await publish_event(
                tx, bus, "release.key-added", key_id, {"key_id": key_id, "root_signed": endorsement is not None}, now_ms
            )
        row = next(r for r in await sql.list_keys(tx) if r["key_id"] == key_id)
    return row


def check_url(url: str) -> None:
    if not url.startswith("https://") or len(url) <= len("https://"):
        raise UsageError(f"the release URL {url!r} is not an https:// URL; nodes fetch releases over https only")


async def publish(
    store: Store,
    bus: Bus | None,
    header: ReleaseHeader,
    *,
    uploaded: Path | None,
    uploaded_digest: tuple[str, int] | None,
    keep_dir: Path,
    serve_url: str,
) -> Row:
    """Verify and store a release; the uploaded file (if any) moves to `keep_dir/<sha256>`."""
    try:
        return await _publish(store, bus, header, uploaded, uploaded_digest, keep_dir, serve_url)
    finally:
        if uploaded is not None:
            await asyncio.to_thread(uploaded.unlink, True)


async def _publish(
    store: Store,
    bus: Bus | None,
    h: ReleaseHeader,
    uploaded: Path | None,
    digest: tuple[str, int] | None,
    keep_dir: Path,
    serve_url: str,
) -> Row:
    release = h.release
    try:
        release.check()
    except rel.BadRelease as e:
        raise UsageError(str(e)) from None
    if uploaded is not None and h.url:
        raise UsageError("give either the release's file or its URL, not both")
    if uploaded is None:
        if not h.url:
            raise UsageError("a release needs its file (uploaded to bc serve) or an https:// URL")
        check_url(h.url)
    elif digest != (h.sha256, h.size):
        got_sha, got_size = digest or ("", 0)
        raise UsageError(
            f"the uploaded file is {got_size} bytes with sha256 {got_sha[:16]}…, not the {h.size} bytes"
            f" with sha256 {h.sha256[:16]}… that the signature covers"
        )
    elif not serve_url:
        raise UsageError("this bc serve does not serve releases: start it with --release-listen, or give --url")
    keys = await release_keys(store)
    try:
        key_id = rel.verify(keys, release, h.signature)
    except rel.BadRelease as e:
        raise UsageError(str(e)) from None
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        old = await sql.release_by_version(tx, release.name, release.version)
        if old is not None and old["platform"]:
            raise Conflict(
                f"release {release.name} {release.version} is already published; a version is published once"
            )
        expected = await sql.next_sequence(tx, release.name)  # counted before an old row goes: never reused
        if release.sequence != expected:
            raise Conflict(
                f"sequence {release.sequence} is not the next of release name {release.name!r} ({expected} is):"
                " another publish came first; publish again"
            )
        if old is not None:  # signed the old way: this publish replaces it, at the new sequence
            await sql.delete_release(tx, release.name, release.version)
        path = ""
        url = h.url
        if uploaded is not None:
            dest = keep_dir / h.sha256
            await asyncio.to_thread(_keep, uploaded, dest)
            path, url = str(dest), f"{serve_url}/releases/{h.sha256}"
        await sql.insert_release(
            tx,
            name=release.name,
            sequence=release.sequence,
            version=release.version,
            platform=release.platform,
            sha256=release.sha256,
            size=release.size,
            signature=h.signature,
            key_id=key_id,
            url=url,
            path=path,
            published_by=actor.current(),
            now_ms=now_ms,
        )
        await publish_event(
            tx,
            bus,
            "release.published",
            release.version,
            {
                "name": release.name,
                "sequence": release.sequence,
                "platform": release.platform,
                "sha256": h.sha256,
                "url": url,
            },
            now_ms,
        )
        row = await sql.release_by_version(tx, release.name, release.version)
    assert row is not None
    return row


async def next_sequence(store: Store, name: str) -> int:
    """The sequence the next release of `name` gets (what `bc release publish` signs)."""
    async with store.transaction(write=False) as tx:
        return await sql.next_sequence(tx, name or rel.DEFAULT_NAME)


@dataclass(frozen=True)
class NodeUpgrade:
    node_id: str
    version: str
    command_id: str
    state: str
    reason: str


@dataclass(frozen=True)
class Status:
    releases: list[Row]
    keys: list[Row]
    nodes: list[NodeUpgrade]


async def status(store: Store) -> Status:
    async with store.transaction(write=False) as tx:
        releases = await sql.list_releases(tx)
        keys = await sql.list_keys(tx)
        latest = await sql.latest_upgrades(tx)
    return Status(releases, keys, [_node_upgrade(r) for r in latest])


def _node_upgrade(r: Row) -> NodeUpgrade:
    version = ""
    try:
        body = session_pb2.CommandBody.FromString(bytes(r["body"]))
        req = kinds_pb2.DaemonUpgradeRequest()
        if body.payload.Unpack(req):
            version = req.version
    except DecodeError:
        pass
    return NodeUpgrade(str(r["node_id"]), version, str(r["id"]), str(r["state"]), str(r["reason"] or ""))


def _keep(uploaded: Path, dest: Path) -> None:
    """Move the upload (fsynced when it was closed) into place, durably: the rename survives a power cut."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.replace(uploaded, dest)
    fsync_dir(dest.parent)
