"""`logs.collect`: the node's logs and journal summary as one `.tar.gz`, uploaded or kept in the data dir.

Bulk lane: it may be slow, so the tarball is built off the event loop, and
it is capped (the cap applies to the compressed bytes, checked as they are
written, so a runaway log stops the build early instead of filling the
disk first). An upload goes to a URL the control plane chose (often a
pre-signed one), so the result reports that URL without its query string:
a signature there is a credential and results are stored and shown.

The control plane chooses the URL, the node's operator where uploads may go
(`agent.kinds.upload_allow`): a URL outside `bc node --upload-allow` is never
dialled; the command fails `forbidden-target` and the tarball is kept here,
as if no URL had been sent. Redirects are not followed, so an allowed host
cannot bounce the upload elsewhere.
"""

from __future__ import annotations

import io
import json
import logging
import tarfile
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from agent.hashing import HashingSink, TooLarge
from agent.kinds.base import InvalidPayload, KindContext, KindResult, TypedExecutor
from agent.kinds.upload_allow import BadUrl, allowed, parse_url
from bc.protocol.pb import kinds_pb2

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 64 << 20
UPLOAD_TIMEOUT_S = 60.0
KEEP_TARBALLS = 8
"""Tarballs kept in `<data_dir>/logs`: a retried or repeated collection must not fill the disk."""
TOO_LARGE = "too-large"
UPLOAD_FAILED = "upload-failed"
FORBIDDEN_TARGET = "forbidden-target"
SUMMARY_NAME = "journal-summary.json"


@dataclass
class Tarball:
    path: Path
    size: int
    sha256: str
    included: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)


def _arcname(path: Path) -> str:
    """The absolute path without its root, so two `agent.log`s in different directories never collide."""
    return str(path.absolute()).lstrip("/") or path.name


def build_tarball(dest: Path, paths: list[Path], summary: bytes | None, cap: int, now: float) -> Tarball:
    """Write the tarball to `dest` (blocking). TooLarge past `cap` compressed bytes; `dest` is then removed.

    `now` (the agent's clock) stamps the summary member, so the tarball says when it was made in the agent's time.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    ball = Tarball(dest, 0, "")
    try:
        with dest.open("wb") as f:
            sink = HashingSink(f, cap)
            with tarfile.open(fileobj=sink, mode="w:gz", dereference=True) as tar:
                for p in paths:
                    if not p.exists():
                        ball.missing.append(str(p))
                        continue
                    try:
                        tar.add(str(p), arcname=_arcname(p))
                    except PermissionError:
                        ball.unreadable.append(str(p))
                        continue
                    ball.included.append(str(p))
                if summary is not None:
                    info = tarfile.TarInfo(SUMMARY_NAME)
                    info.size = len(summary)
                    info.mtime = int(now)
                    info.mode = 0o644
                    tar.addfile(info, io.BytesIO(summary))
            f.flush()
    except BaseException:
        dest.unlink(missing_ok=True)
        raise
    ball.size, ball.sha256 = sink.size, sink.sha256.hexdigest()
    return ball


_TARBALL_NAME = "logs-%Y%m%dT%H%M%S.%fZ.tar.gz"


def _final_path(logs_dir: Path, now: float) -> Path:
    """`logs-<UTC time to the microsecond>.tar.gz` at `now` (the agent's clock), or just after the newest
    tarball kept: unique, and name order is age order (for pruning), even when two collections fall in one
    microsecond or the clock stands still. Blocking: lists the directory."""
    at = datetime.fromtimestamp(now, UTC)
    for p in logs_dir.glob("logs-*.tar.gz"):
        try:
            kept = datetime.strptime(p.name, _TARBALL_NAME).replace(tzinfo=UTC)
        except ValueError:
            continue  # not one of ours
        if kept >= at:
            at = kept + timedelta(microseconds=1)
    return logs_dir / at.strftime(_TARBALL_NAME)


def _prune(logs_dir: Path, keep: int) -> None:
    """Remove all but the newest `keep` tarballs, by name (mtimes tie within a second; names do not).

    Partial files left by a crash go too: the bulk lane runs one command at
    a time, so no other collection is writing one now.
    """
    for p in sorted(logs_dir.glob("logs-*.tar.gz"), reverse=True)[keep:]:
        p.unlink(missing_ok=True)
    for p in logs_dir.glob(".logs-*.partial"):
        p.unlink(missing_ok=True)


def redact_url(url: str) -> str:
    """The URL without query, fragment or user info: what may be stored in a result."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"  # an IPv6 literal
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _allowlist(ctx: KindContext) -> str:
    if not ctx.upload_allow:
        return "bc node --upload-allow allows none"
    return "bc node --upload-allow allows " + ", ".join(str(p) for p in ctx.upload_allow)


class LogsCollect(TypedExecutor[kinds_pb2.LogsCollectRequest]):
    """Result: uploaded `{uploaded_to, bytes, sha256}`; kept `{path, bytes, sha256}` (and `forbidden`, the URL
    refused, on a `forbidden-target` failure); all list `files` and `missing`."""

    name = "logs.collect"
    request_type = kinds_pb2.LogsCollectRequest

    def validate(self, request: kinds_pb2.LogsCollectRequest) -> None:
        if request.max_bytes < 0:
            raise InvalidPayload(f"max_bytes is {request.max_bytes}; 0 means the default cap")
        if request.upload_url:
            try:
                parse_url(request.upload_url)
            except BadUrl as e:
                raise InvalidPayload(str(e)) from None

    async def execute(self, ctx: KindContext, request: kinds_pb2.LogsCollectRequest) -> KindResult:
        cap = request.max_bytes or DEFAULT_MAX_BYTES
        summary: bytes | None = None
        if ctx.journal_summary is not None:
            summary = (json.dumps(await ctx.journal_summary(), indent=2, sort_keys=True, default=str) + "\n").encode()
        logs_dir = ctx.data_dir / "logs"
        final = await ctx.offload(_final_path, logs_dir, ctx.clock.now())
        partial = final.with_name(f".{final.name}.partial")
        try:
            ball = await ctx.offload(build_tarball, partial, list(ctx.log_paths), summary, cap, ctx.clock.now())
        except TooLarge:
            return KindResult.failure(TOO_LARGE, f"the logs exceed {cap} bytes compressed", {"max_bytes": cap})
        listing: dict[str, Any] = {"files": ball.included, "missing": ball.missing}
        if ball.unreadable:
            listing["unreadable"] = ball.unreadable
        if request.upload_url and allowed(parse_url(request.upload_url), ctx.upload_allow):
            try:
                return await self._upload(ctx, request.upload_url, ball, listing)
            finally:
                partial.unlink(missing_ok=True)
        await ctx.offload(partial.replace, final)
        await ctx.offload(_prune, logs_dir, KEEP_TARBALLS)
        kept = {"path": str(final), "bytes": ball.size, "sha256": ball.sha256, **listing}
        if request.upload_url:
            shown = redact_url(request.upload_url)
            log.warning("event=logs.upload-forbidden url=%s kept=%s", shown, final)
            return KindResult.failure(
                FORBIDDEN_TARGET,
                f"this node's operator does not allow uploads to {shown} ({_allowlist(ctx)}); kept {final.name}",
                {**kept, "forbidden": shown},
            )
        log.info("event=logs.collected path=%s bytes=%d", final, ball.size)
        return KindResult.success(kept, f"kept {final.name}")

    @staticmethod
    async def _upload(ctx: KindContext, url: str, ball: Tarball, listing: dict[str, Any]) -> KindResult:
        shown = redact_url(url)
        body = await ctx.offload(ball.path.read_bytes)  # capped: Content-Length, which signed PUTs need
        try:
            async with httpx.AsyncClient(timeout=UPLOAD_TIMEOUT_S, follow_redirects=False) as client:
                resp = await client.put(url, content=body, headers={"Content-Type": "application/gzip"})
        except httpx.HTTPError as e:
            return KindResult.failure(UPLOAD_FAILED, f"PUT {shown} failed: {type(e).__name__}: {e}")
        if not resp.is_success:
            return KindResult.failure(
                UPLOAD_FAILED, f"PUT {shown} answered {resp.status_code}", {"status": resp.status_code}
            )
        log.info("event=logs.uploaded url=%s bytes=%d", shown, ball.size)
        return KindResult.success(
            {"uploaded_to": shown, "bytes": ball.size, "sha256": ball.sha256, "status": resp.status_code, **listing},
            f"uploaded {ball.size} bytes",
        )
