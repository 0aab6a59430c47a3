"""A hold's env file: `<env_dir>/bc-<allocation id>.env`, and how the agent knows the ones it wrote.

The env directory may be shared (`/run/bc/allocations` is ours, but an
operator may point `--env-dir` at a directory other tools write to), so the
cleanup of orphaned env files deletes only a file that is provably ours: its
name is `bc-<allocation id>.env` with a valid allocation id, and its first
line is the marker naming that same allocation. A file missing either is
left alone, whatever it is called. The marker is a `#` comment, which every
env-file reader (systemd's EnvironmentFile, `docker --env-file`, a shell's
`source`) skips.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from agent.hw.cdi import entries, valid_allocation_id

PREFIX = "bc-"
SUFFIX = ".env"
_MARKER_READ = 512


def marker(allocation_id: str) -> str:
    return f"# written by bc node for allocation {allocation_id}; removed with its hold"


def env_path(env_dir: Path, allocation_id: str) -> Path:
    return env_dir / f"{PREFIX}{allocation_id}{SUFFIX}"


def env_bytes(allocation_id: str, lines: Sequence[str]) -> bytes:
    """The file: the marker, then one KEY=VALUE per line."""
    return "".join(f"{line}\n" for line in (marker(allocation_id), *lines)).encode()


def allocation_of(path: Path) -> str | None:
    """The allocation whose env file this is, or None when the agent did not write it. Blocking: reads the file."""
    name = path.name
    if not (name.startswith(PREFIX) and name.endswith(SUFFIX)):
        return None
    allocation_id = name[len(PREFIX) : -len(SUFFIX)]
    if not valid_allocation_id(allocation_id):
        return None
    try:
        with path.open("rb") as f:
            head = f.read(_MARKER_READ)
    except OSError:
        return None
    first = head.split(b"\n", 1)[0]
    return allocation_id if first == marker(allocation_id).encode() else None


def ours(env_dir: Path) -> dict[str, Path]:
    """Every env file in `env_dir` the agent wrote, by allocation id. Blocking."""
    found: dict[str, Path] = {}
    for path in entries(env_dir, PREFIX, SUFFIX, regular_only=True):
        allocation_id = allocation_of(path)
        if allocation_id is not None:
            found[allocation_id] = path
    return found
