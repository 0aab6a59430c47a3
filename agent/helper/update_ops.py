"""The helper's self-update operations: the privileged half of an unprivileged node's A/B swap. Pure, no I/O.

The agent downloads a release into its own data dir and checks it there, as
it does as root (agent.upgrade.controller); the install dir (`/opt/bc`) is
root's, so the agent asks the helper to take each step that changes it:

    update.stage    offset, data (base64)     append to `bc.<other>.partial` in the install dir (0600): `other` is
                                              the slot `current` does not name, read by the helper; offset 0
                                              starts it anew, any other must be the staged size
    update.install  name, version, sequence,  verify the staged file AGAIN, as root: the signature over exactly
                    platform, sha256, size,   those fields under the release roots root listed in
                    signature, keys,          /etc/bc/release-roots.pem, or under a release key one of those roots
                    running_version           endorsed (`keys`: the agent's bundle's keys and endorsements, worth
                                              nothing without a root's signature); its sha256 and size; the swap
                                              rules (this platform, the node's release name, newer than the
                                              sequence it runs, not a version that failed); then PLACE (0755,
                                              renamed to `bc.<other>`, recorded). A refusal removes the staged file
    update.step     step, command_id and      one step of agent.upgrade.swap_rules (arm, switch, confirm, disarm,
                    deadline (arm only)       switch-back, fail, abort); an illegal step for the record and
                                              `current` on disk is refused. ARM arms the release the helper placed
                                              in the other slot, never one the request names, and only when the
                                              swap rules would install it now (no arming an older slot)
    update.remember refused (null or name,    the record's last refused release (the agent's memory, so the same
                    sequence, version,        release is not downloaded again in a loop)
                    reason, message)

Each answers `{"disk": ...}` (`swap_rules.disk_json`), the install dir after it.
The checks that need the disk, the staged file's digest and root's list of
roots are pure functions here (`check_stage`, `check_install`, `check_step`);
`update_effects` gathers those facts as root and calls them.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from agent.helper.plans import (
    Layout,
    Plan,
    Planner,
    Refused,
    UpdateInstall,
    UpdateRemember,
    UpdateStage,
    UpdateStep,
    arg_int,
    arg_str,
)
from agent.upgrade import swap_rules as sr
from bc.pki import releases

MAX_CHUNK = 2 << 20
"""Bytes per update.stage: 2.7 MiB once in base64, under the wire's 4 MiB frame."""
MAX_KEYS = 32
MAX_ROOTS_BYTES = 64 << 10
MAX_MESSAGE = 2000
MAX_DEADLINE = float(1 << 41)
STEPS = {s.value: s for s in sr.Step if s not in (sr.Step.STAGE, sr.Step.PLACE, sr.Step.RESTART)}
"""The steps `update.step` takes; STAGE is update.stage, PLACE update.install, RESTART the agent's own."""
RELEASE_FIELDS = ("name", "version", "sequence", "platform", "sha256", "size")
"""What the release signature covers (bc.pki.releases.Release), as update.install takes them."""
_COMMAND_ID = re.compile(r"[A-Za-z0-9._:-]{0,128}")
_REASON = re.compile(r"[a-z][a-z-]{0,39}")
_PEM_KEY = re.compile(rb"-----BEGIN PUBLIC KEY-----\r?\n[A-Za-z0-9+/=\r\n]+-----END PUBLIC KEY-----")


def _bytes(req: Mapping[str, Any], key: str, *, limit: int, exact: bool = False) -> bytes:
    """Base64 of at most `limit` bytes (exactly, with `exact`)."""
    text = arg_str(req, key, limit=4 * ((limit + 2) // 3))
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise Refused(f"{key} is not base64") from None
    if len(data) > limit or (exact and len(data) != limit):
        raise Refused(f"{key} is {len(data)} bytes, not {'' if exact else 'at most '}{limit}")
    return data


# -- update.stage ----------------------------------------------------------------------------------


def _stage(req: Mapping[str, Any], lay: Layout) -> Plan:
    offset = arg_int(req, "offset", 0, releases.MAX_SIZE)
    data = _bytes(req, "data", limit=MAX_CHUNK)
    if offset + len(data) > releases.MAX_SIZE:
        raise Refused(f"a release is at most {releases.MAX_SIZE} bytes")
    return (UpdateStage(lay.install_dir, offset, data),)


def check_stage(disk: sr.Disk, offset: int, staged_size: int | None) -> None:
    """Refused unless a chunk at `offset` may be written to the staged file (of `staged_size` bytes, or none)."""
    if (busy := sr.unsettled(disk.record)) is not None:
        raise Refused(busy[1])
    if offset and offset != staged_size:
        raise Refused(f"offset {offset} is not the staged file's size ({staged_size or 0}); stage from offset 0")


# -- update.install --------------------------------------------------------------------------------


def _install(req: Mapping[str, Any], lay: Layout) -> Plan:
    release = releases.Release(
        arg_str(req, "name", limit=64),
        arg_str(req, "version", limit=64),
        arg_int(req, "sequence", 1, releases.MAX_SEQUENCE),
        arg_str(req, "platform", limit=32),
        arg_str(req, "sha256", limit=64),
        arg_int(req, "size", 1, releases.MAX_SIZE),
    )
    try:
        release.check()
    except releases.BadRelease as e:
        raise Refused(str(e)) from None
    signature = _bytes(req, "signature", limit=64, exact=True)
    raw = req.get("keys")
    if not isinstance(raw, list) or len(raw) > MAX_KEYS:
        raise Refused(f"keys must be a list of at most {MAX_KEYS} objects")
    keys = []
    for k in raw:
        if not isinstance(k, dict) or set(k) != {"public_key", "root_signature"}:
            raise Refused("each of keys is {public_key, root_signature}")
        keys.append((_bytes(k, "public_key", limit=32, exact=True), _bytes(k, "root_signature", limit=64)))
    running = arg_str(req, "running_version", limit=64)
    if not releases.VERSION_RE.fullmatch(running):
        raise Refused(f"running_version {running[:64]!r} is not a release version")
    return (UpdateInstall(lay.install_dir, lay.release_roots, release, signature, tuple(keys), running),)


def parse_roots(pem: bytes) -> list[bytes]:
    """The raw Ed25519 public keys of the PEM `PUBLIC KEY` blocks in root's list (anything between them is a
    comment); Refused when there is none, or a block is not an Ed25519 key."""
    keys = []
    for block in _PEM_KEY.findall(pem):
        try:
            key = serialization.load_pem_public_key(block)
        except ValueError:
            raise Refused("a PUBLIC KEY block of the release roots does not load") from None
        if not isinstance(key, ed25519.Ed25519PublicKey):
            raise Refused("a key of the release roots is not an Ed25519 key")
        keys.append(releases.public_bytes(key))
    if not keys:
        raise Refused("the release roots list no Ed25519 PUBLIC KEY")
    return keys


def trusted_keys(roots: Sequence[bytes], keys: Sequence[tuple[bytes, bytes]]) -> list[bytes]:
    """The roots themselves, and each offered key that one of them endorsed (`bc.pki.releases.endorse`)."""
    anchors = [ed25519.Ed25519PublicKey.from_public_bytes(r) for r in roots]
    endorsed = [k for k, sig in keys if any(releases.endorsed_by(a, k, sig) for a in anchors)]
    return list(dict.fromkeys([*roots, *endorsed]))


def check_install(
    disk: sr.Disk,
    release: releases.Release,
    signature: bytes,
    keys: Sequence[tuple[bytes, bytes]],
    roots: Sequence[bytes],
    staged: tuple[str, int] | None,
    host_platform: str,
    running_version: str,
) -> tuple[sr.Disk, str]:
    """The disk after PLACE, and the id of the key that signed; Refused unless root's roots vouch for exactly
    `release`, the staged file is its bytes, and the swap rules let this node install it now."""
    try:
        key = releases.verify(trusted_keys(roots, keys), release, signature)
    except releases.BadRelease:
        raise Refused(
            f"the signature of {release.describe()} does not verify under the helper's release roots"
            f" ({len(roots)} in its list) or a release key one of them endorsed"
        ) from None
    if staged is None:
        raise Refused("nothing is staged: send the release with update.stage first")
    if staged != (release.sha256, release.size):
        raise Refused(
            f"the staged file is {staged[1]} bytes with sha256 {staged[0][:16]}…, not the release's"
            f" {release.size} bytes with sha256 {release.sha256[:16]}…"
        )
    offer = sr.Offer(release.name, release.version, release.sequence, release.platform)
    why = sr.refusal(disk.record, disk.current, offer, host_platform)
    if why is not None:
        raise Refused(f"{why[1]} ({why[0]})")
    if disk.current not in disk.record.slots:  # the running slot, as the first install left it: unnamed
        slots = {**disk.record.slots, disk.current: sr.Installed(running_version, 0)}
        disk = replace(disk, record=replace(disk.record, slots=slots))
    plan = sr.Plan("", release.version, release.sequence, 0.0, release.name)
    try:
        return sr.apply(disk, sr.Step.PLACE, plan), key
    except sr.SwapError as e:
        raise Refused(str(e)) from None


# -- update.step -----------------------------------------------------------------------------------


def _step(req: Mapping[str, Any], lay: Layout) -> Plan:
    name = arg_str(req, "step", limit=16)
    step = STEPS.get(name)
    if step is None:
        raise Refused(f"step {name!r} is not one of {', '.join(STEPS)}")
    if step is not sr.Step.ARM:
        extra = sorted({"command_id", "deadline"} & set(req))
        if extra:
            raise Refused(f"{name} takes no {', '.join(extra)}")
        return (UpdateStep(lay.install_dir, step),)
    command_id = arg_str(req, "command_id", limit=128)
    if not _COMMAND_ID.fullmatch(command_id):
        raise Refused(f"command_id {command_id[:60]!r} is not a command id")
    deadline = req.get("deadline")
    if isinstance(deadline, bool) or not isinstance(deadline, int | float) or not 0 <= deadline <= MAX_DEADLINE:
        raise Refused("deadline must be a number of seconds since the epoch")
    return (UpdateStep(lay.install_dir, step, command_id, float(deadline)),)


def check_step(disk: sr.Disk, step: sr.Step, command_id: str, deadline: float, host_platform: str) -> sr.Disk:
    """The disk after `step`; Refused for a step that is illegal here, and for an ARM of a slot the swap rules
    would not install now (the one a rollback left, an older release)."""
    plan = None
    if step is sr.Step.ARM:
        to = sr.other(disk.current)
        placed = disk.record.slots.get(to)
        if to not in disk.slots or placed is None or not placed.sequence:
            raise Refused(f"slot {to} holds no release the helper installed")
        offer = sr.Offer(placed.name or releases.DEFAULT_NAME, placed.version, placed.sequence, host_platform)
        why = sr.refusal(disk.record, disk.current, offer, host_platform)
        if why is not None:
            raise Refused(f"slot {to}: {why[1]} ({why[0]})")
        plan = sr.Plan(command_id, placed.version, placed.sequence, deadline, placed.name)
    try:
        return sr.apply(disk, step, plan)
    except sr.SwapError as e:
        raise Refused(str(e)) from None


# -- update.remember -------------------------------------------------------------------------------


def _remember(req: Mapping[str, Any], lay: Layout) -> Plan:
    raw = req.get("refused", 0)
    if raw is None:
        return (UpdateRemember(lay.install_dir, None),)
    if not isinstance(raw, dict) or set(raw) != {"name", "sequence", "version", "reason", "message"}:
        raise Refused("refused must be null or {name, sequence, version, reason, message}")
    name, version = arg_str(raw, "name", limit=64), arg_str(raw, "version", limit=64)
    if not releases.NAME_RE.fullmatch(name) or not releases.VERSION_RE.fullmatch(version):
        raise Refused("refused names no release")
    reason, message = arg_str(raw, "reason", limit=40), arg_str(raw, "message", limit=MAX_MESSAGE)
    if not _REASON.fullmatch(reason) or any(c in message for c in "\0\r\n"):
        raise Refused("refused's reason or message is not one sentence")
    refused = sr.Refused(name, arg_int(raw, "sequence", 0, releases.MAX_SEQUENCE), version, reason, message)
    return (UpdateRemember(lay.install_dir, refused),)


TABLE: dict[str, tuple[frozenset[str], Planner]] = {
    "update.stage": (frozenset({"offset", "data"}), _stage),
    "update.install": (frozenset({*RELEASE_FIELDS, "signature", "keys", "running_version"}), _install),
    "update.step": (frozenset({"step", "command_id", "deadline"}), _step),
    "update.remember": (frozenset({"refused"}), _remember),
}
