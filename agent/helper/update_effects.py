"""Carrying out the update operations as root: gather the facts (the install dir, the staged file's digest, root's
release roots), ask the pure checks of `update_ops`, then change the install dir through agent.upgrade.slots.

Blocking: the server runs `carry` through its offload. A check that fails is
`Refused` (the server answers `refused: …`); the install dir is then as it was,
but for `update.install`, which removes a staged file it refused.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from dataclasses import replace
from pathlib import Path
from typing import Any

from agent.helper import update_ops
from agent.helper.plans import Refused, UpdateInstall, UpdateRemember, UpdateStage, UpdateStep
from agent.upgrade import slots as sl
from agent.upgrade import swap_rules as sr
from bc.pki import releases
from bc.runtime.files import fsync_dir

log = logging.getLogger("agent.helper")

UpdateEffect = UpdateStage | UpdateInstall | UpdateStep | UpdateRemember


def carry(effect: UpdateEffect) -> dict[str, Any]:
    """Carry `effect` out; `{"disk": …}` after it. Refused when its check fails."""
    if isinstance(effect, UpdateStage):
        return _stage(effect)
    if isinstance(effect, UpdateInstall):
        return _install(effect)
    if isinstance(effect, UpdateStep):
        old = _disk(effect.path)
        new = update_ops.check_step(old, effect.step, effect.command_id, effect.deadline, releases.host_platform())
        sl.realize(effect.path, old, new, effect.step)
        log.info(
            "event=helper.update-step step=%s record=%s current=%s", effect.step.value, new.record.state, new.current
        )
        return {"disk": sr.disk_json(new)}
    old = _disk(effect.path)
    new = replace(old, record=replace(old.record, refused=effect.refused))
    if new.record != old.record:
        sl.write_record(effect.path, new.record)
    return {"disk": sr.disk_json(new)}


def _disk(install_dir: Path) -> sr.Disk:
    try:
        return sl.read_disk(install_dir)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise Refused(f"there is no A/B install in {install_dir} ({type(e).__name__}: {e})") from None


def _staged(disk: sr.Disk, install_dir: Path) -> Path:
    return install_dir / sl.partial_file(sr.other(disk.current))


def _stage(effect: UpdateStage) -> dict[str, Any]:
    disk = _disk(effect.path)
    path = _staged(disk, effect.path)
    try:
        size: int | None = os.lstat(path).st_size
    except FileNotFoundError:
        size = None
    update_ops.check_stage(disk, effect.offset, size)
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_TRUNC if effect.offset == 0 else 0)
    fd = os.open(path, flags, 0o600)
    try:
        if effect.offset == 0:
            os.fchmod(fd, 0o600)  # a file a crash left here: nobody's until it is verified
        view = memoryview(effect.data)
        at = effect.offset
        while view:
            n = os.pwrite(fd, view, at)
            view, at = view[n:], at + n
    finally:
        os.close(fd)
    return {"disk": sr.disk_json(_disk(effect.path)), "staged": effect.offset + len(effect.data)}


def read_roots(path: Path) -> list[bytes]:
    """Root's list of release roots: a file the helper's own user owns and no one else may write."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise Refused(
            f"{path} does not exist: the helper installs only releases signed under the release roots root lists"
            " there (docs/node-security.md)"
        ) from None
    except OSError as e:
        raise Refused(f"cannot read {path}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise Refused(f"{path} must be a file of uid {os.geteuid()} that no one else may write")
        data = os.read(fd, update_ops.MAX_ROOTS_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > update_ops.MAX_ROOTS_BYTES:
        raise Refused(f"{path} is over {update_ops.MAX_ROOTS_BYTES} bytes")
    try:
        return update_ops.parse_roots(data)
    except Refused as e:
        raise Refused(f"{path}: {e}") from None


def _install(effect: UpdateInstall) -> dict[str, Any]:
    roots = read_roots(effect.roots)
    disk = _disk(effect.path)
    path = _staged(disk, effect.path)
    staged = releases.file_digest(path) if path.is_file() and not path.is_symlink() else None
    try:
        new, key = update_ops.check_install(
            disk,
            effect.release,
            effect.signature,
            effect.keys,
            roots,
            staged,
            releases.host_platform(),
            effect.running_version,
        )
    except Refused:
        if staged is not None:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                fsync_dir(effect.path)
        raise
    sl.realize(effect.path, disk, new, sr.Step.PLACE)
    log.warning(
        "event=helper.update-installed release=%r slot=%s sha256=%s key=%s",
        effect.release.describe(),
        sr.other(disk.current),
        effect.release.sha256,
        key,
    )
    return {"disk": sr.disk_json(new)}
