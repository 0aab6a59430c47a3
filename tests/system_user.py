"""A throwaway system user and a directory it can traverse, for the tests that run `bc helper` as root beside
an unprivileged agent (tests/integration/test_helper_privsep.py, tests/e2e/test_node_helper.py)."""

from __future__ import annotations

import os
import secrets
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

TOOLS = ("useradd", "userdel", "setpriv")


REPO = Path(__file__).resolve().parents[1]


def why_not() -> str | None:
    """Why this machine cannot make a user and run this checkout's code as it (None: it can)."""
    if os.geteuid() != 0:
        return "creating a user and running bc helper as root need root"
    for tool in TOOLS:
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    closed = _closed_to_others(REPO)
    if closed is not None:
        return f"another user cannot reach this checkout ({closed} is not searchable by others)"
    return None


def _closed_to_others(path: Path) -> Path | None:
    """The first directory on the way to `path` that other users may not enter (a 0700 temp dir), or None."""
    for d in [*reversed(path.parents), path]:
        if not d.stat().st_mode & stat.S_IXOTH:
            return d
    return None


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int


@contextmanager
def system_user(prefix: str) -> Iterator[User]:
    """A new system user with its own group and no home (skips the test where useradd refuses); userdel after."""
    name = f"{prefix}{secrets.token_hex(4)}"
    made = subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "--user-group", name],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if made.returncode != 0:
        pytest.skip(f"useradd could not create a user here: {made.stderr.strip()}")
    try:
        uid = subprocess.run(["id", "-u", name], capture_output=True, text=True, check=True).stdout
        gid = subprocess.run(["id", "-g", name], capture_output=True, text=True, check=True).stdout
        yield User(name, int(uid), int(gid))
    finally:
        gone = subprocess.run(["userdel", name], capture_output=True, text=True, timeout=30)
        assert gone.returncode == 0, f"userdel {name}: {gone.stderr.strip()}"


@contextmanager
def traversable_dir(prefix: str) -> Iterator[Path]:
    """A temp dir (0755) another user can traverse: pytest's own are root's 0700."""
    d = Path(tempfile.mkdtemp(prefix=prefix))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def as_user(uid: int, *argv: str, gid: int | None = None) -> list[str]:
    """`argv` run as `uid` and `gid` (default: the number `uid`), with no supplementary groups and no
    inheritable capabilities."""
    group = uid if gid is None else gid
    return ["setpriv", f"--reuid={uid}", f"--regid={group}", "--clear-groups", "--inh-caps=-all", *argv]
