"""What `bc --version` says: the version, where the program came from, and what it runs on.

A support question starts with "which build is this?", so besides the version
we say the commit and the build date, the Python, and the versions of the
libraries whose bugs we would be chasing (grpcio, cryptography, textual).

Where the commit and the build date come from, first found wins:

1. `bc._build_info`, a module that `build/dist.py` writes into its staging copy
   of the source when it builds the zipapp or the binary. It is never
   committed: a checkout has no such module.
2. `git`, when this code runs from a checkout (a `.git` next to the packages):
   the commit, with `-dirty` if tracked files differ from it. A checkout has no
   build date.
3. Otherwise "unknown" (e.g. a wheel installed without its build info).
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

UNKNOWN = "unknown"
NOT_INSTALLED = "not installed"

#: The libraries named in the version text: distribution name → the module to ask when the
#: distribution's metadata is missing (a frozen binary may carry the code without it).
LIBRARIES: dict[str, str] = {"grpcio": "grpc", "cryptography": "cryptography", "textual": "textual"}

_GIT_TIMEOUT_S = 2.0  # `bc --version` must answer promptly even on a slow or wedged filesystem


@dataclass(frozen=True)
class BuildInfo:
    """Everything `bc --version` prints."""

    version: str
    commit: str
    build_date: str
    #: "binary" (PyInstaller), "zipapp" (shiv), "checkout" (a git work tree) or "installed" (anything else).
    artifact: str
    python: str
    libraries: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "commit": self.commit,
            "build_date": self.build_date,
            "artifact": self.artifact,
            "python": self.python,
            "libraries": dict(self.libraries),
        }

    def text(self) -> str:
        """The human form; the first line stays `bc <version>` so scripts that read it keep working."""
        rows = [
            ("commit", self.commit),
            ("built", f"{self.build_date} ({self.artifact})"),
            ("python", self.python),
            *self.libraries.items(),
        ]
        width = max(len(k) for k, _ in rows) + 1
        return "\n".join([f"bc {self.version}", *(f"{k + ':':<{width}} {v}" for k, v in rows)])


def bc_version() -> str:
    """The version of bc itself: the baked one in a build, else the installed distribution's."""
    baked = _baked()
    if baked is not None and isinstance(getattr(baked, "VERSION", None), str):
        return str(baked.VERSION)
    try:
        return metadata.version("bc")
    except metadata.PackageNotFoundError:
        return "0.0.0+unknown"


def test_never_dial() -> bool:
    """A test-only build (`build/dist.py --test-never-dial`) whose agent never reaches a gateway: the new
    binary of the self-update rollback test. Never true for a checkout, a wheel or a normal build."""
    return bool(getattr(_baked(), "NEVER_DIAL", False))


def build_info() -> BuildInfo:
    baked = _baked()
    if baked is not None:
        commit = str(getattr(baked, "COMMIT", UNKNOWN))
        build_date = str(getattr(baked, "BUILD_DATE", UNKNOWN))
        artifact = str(getattr(baked, "ARTIFACT", "installed"))
    else:
        checkout = _checkout_root()
        commit = (_git_commit(checkout) if checkout else None) or UNKNOWN
        build_date = UNKNOWN
        artifact = "checkout" if checkout else "installed"
    return BuildInfo(
        version=bc_version(),
        commit=commit,
        build_date=build_date,
        artifact=artifact,
        python=python_description(),
        libraries={name: library_version(name) for name in LIBRARIES},
    )


def python_description() -> str:
    impl = {"cpython": "CPython", "pypy": "PyPy"}.get(sys.implementation.name, sys.implementation.name)
    v = sys.version_info
    return f"{v.major}.{v.minor}.{v.micro} ({impl})"


def library_version(dist: str) -> str:
    """The installed version of a distribution, or "not installed"."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        pass
    module = LIBRARIES.get(dist, dist)
    try:
        mod = importlib.import_module(module)
    except ImportError:
        return NOT_INSTALLED
    return str(getattr(mod, "__version__", UNKNOWN))


def _baked() -> Any:
    try:
        return importlib.import_module("bc._build_info")
    except ImportError:
        return None


def _checkout_root() -> Path | None:
    """The work tree this code runs from, if it is one (not a site-packages copy)."""
    root = Path(__file__).resolve().parent.parent
    return root if (root / ".git").exists() else None


def _git(root: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(root), *args],
            capture_output=True,
            text=True,
            timeout=_GIT_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None  # no git on this host, or it hung: the commit is simply unknown
    return out.stdout.strip() if out.returncode == 0 else None


def _git_commit(root: Path) -> str | None:
    commit = _git(root, "rev-parse", "--short=12", "HEAD")
    if not commit:
        return None
    # Untracked files don't make a build differ from its commit in a way we ship; edited tracked files do.
    status = _git(root, "status", "--porcelain", "--untracked-files=no")
    return f"{commit}-dirty" if status else commit
