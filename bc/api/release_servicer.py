"""The Admin API's self-update RPCs: add a release key, publish a release (streamed), list releases.

A mixin of `AdminServicer` (which guards every RPC, `bc.api.admin_roles`). `PublishRelease` is
client-streaming: the header first, then the file in chunks, written to a temporary file under
`<data-dir>/releases` off the loop and hashed on the way; `bc.control.trust.releases.publish` then checks it
and keeps it, or removes it.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import BinaryIO

import grpc
from cryptography.hazmat.primitives.asymmetric import ed25519

from bc.api.calls import AdminCalls
from bc.control.base.bus import Bus
from bc.control.signing.signer import Signer
from bc.control.trust import releases as rel_ctl
from bc.errors import UsageError
from bc.protocol.pb import admin_pb2
from bc.store import Row, Store

MAX_RELEASE_BYTES = 1 << 31


def release_info(r: Row) -> admin_pb2.ReleaseInfo:
    return admin_pb2.ReleaseInfo(
        sequence=int(r["sequence"]),
        version=str(r["version"]),
        sha256=str(r["sha256"]),
        size=int(r["size"]),
        signature=bytes(r["signature"]),
        key_id=str(r["key_id"]),
        url=str(r["url"]),
        published_by=str(r["published_by"]),
        published_at_ms=int(r["published_at_ms"]),
        name=str(r["name"]),
        platform=str(r["platform"]),
    )


def key_info(r: Row) -> admin_pb2.ReleaseKeyInfo:
    return admin_pb2.ReleaseKeyInfo(
        key_id=str(r["key_id"]),
        public_key=bytes(r["public_key"]),
        added_by=str(r["added_by"]),
        added_at_ms=int(r["added_at_ms"]),
    )


class ReleaseRpcs(AdminCalls):
    store: Store
    bus: Bus
    signer: Signer
    releases_dir: Path
    release_url: str
    """`https://host:port` of `bc serve --release-listen` (empty: this server keeps no release files)."""

    async def AddReleaseKey(
        self, request: admin_pb2.AddReleaseKeyRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ReleaseKeyInfo:
        async def go() -> admin_pb2.ReleaseKeyInfo:
            keys = self.signer.keys
            root: rel_ctl.RootAtHand | None = None
            if keys is not None:  # signing on: the root endorses the key (signed here, or where the file is)
                public = keys.root.public_key()
                assert isinstance(public, ed25519.Ed25519PublicKey)
                on_host = keys.root_signer()
                root = rel_ctl.RootAtHand(public, on_host.key if on_host is not None else None)
            row = await rel_ctl.add_key(
                self.store, self.bus, request.public_key, root=root, root_signature=request.root_signature
            )
            return key_info(row)

        return await self._call(context, go)

    async def PublishRelease(
        self, request_iterator: AsyncIterator[admin_pb2.PublishReleaseChunk], context: grpc.aio.ServicerContext
    ) -> admin_pb2.ReleaseInfo:
        async def go() -> admin_pb2.ReleaseInfo:
            header: admin_pb2.PublishReleaseChunk | None = None
            tmp: Path | None = None
            f: BinaryIO | None = None
            h = hashlib.sha256()
            size = 0
            try:
                async for chunk in request_iterator:
                    if header is None:
                        header = chunk
                    elif (
                        chunk.version
                        or chunk.sha256
                        or chunk.size
                        or chunk.signature
                        or chunk.url
                        or chunk.name
                        or chunk.sequence
                        or chunk.platform
                    ):
                        raise UsageError("only the first chunk of a published release may carry its header")
                    if not chunk.data:
                        continue
                    if f is None:
                        await asyncio.to_thread(self.releases_dir.mkdir, parents=True, exist_ok=True)
                        fd, name = await asyncio.to_thread(tempfile.mkstemp, ".upload", ".", self.releases_dir)
                        tmp, f = Path(name), os.fdopen(fd, "wb")
                    size += len(chunk.data)
                    if size > MAX_RELEASE_BYTES:
                        raise UsageError("a release is at most 2 GiB")
                    h.update(chunk.data)
                    await asyncio.to_thread(f.write, chunk.data)
                if f is not None:
                    await asyncio.to_thread(_close, f)
                    f = None
                if header is None:
                    raise UsageError("the release upload was empty")
                row = await rel_ctl.publish(
                    self.store,
                    self.bus,
                    rel_ctl.ReleaseHeader(
                        header.version,
                        header.sha256,
                        header.size,
                        header.signature,
                        header.url,
                        name=header.name,
                        sequence=header.sequence,
                        platform=header.platform,
                    ),
                    uploaded=tmp,
                    uploaded_digest=(h.hexdigest(), size) if tmp is not None else None,
                    keep_dir=self.releases_dir,
                    serve_url=self.release_url,
                )
                tmp = None
                return release_info(row)
            finally:
                if f is not None:
                    await asyncio.to_thread(f.close)
                if tmp is not None:
                    await asyncio.to_thread(tmp.unlink, True)

        return await self._call(context, go)

    async def ListReleases(
        self, request: admin_pb2.ListReleasesRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ListReleasesResponse:
        async def go() -> admin_pb2.ListReleasesResponse:
            st = await rel_ctl.status(self.store)
            next_sequence = await rel_ctl.next_sequence(self.store, request.name)
            return admin_pb2.ListReleasesResponse(
                releases=[release_info(r) for r in st.releases],
                keys=[key_info(r) for r in st.keys],
                nodes=[
                    admin_pb2.NodeUpgradeInfo(
                        node_id=n.node_id, version=n.version, command_id=n.command_id, state=n.state, reason=n.reason
                    )
                    for n in st.nodes
                ],
                serve_url=self.release_url,
                next_sequence=next_sequence,
            )

        return await self._call(context, go)


def _close(f: BinaryIO) -> None:
    f.flush()
    os.fsync(f.fileno())
    f.close()
