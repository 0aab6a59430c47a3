"""The suite's own HOME: what a test could write in the operator's real one goes to a scratch directory.

`make test` once overwrote `~/.config/bc/config.json` (a test's `bc serve` copied its operator config
there), after which the operator's CLI pointed at a dead test port. So every test process runs with:

* `HOME` and `XDG_CONFIG_HOME` in a scratch directory, so `~/.config/bc`, `~/.local/share/bc` and
  anything else a child process writes under `~` land there;
* `BC_DATA_DIR` in it too, so a `bc serve` or `bc node` started without `--data-dir` never writes
  `/var/lib/bc` (the default as root);
* `BC_CONFIG` unset rather than pointed at a scratch file: when set it is the only config the CLI will
  read (bc/runtime/config.py), so a scratch value would hide the lookup the tests exercise, and the operator's
  own value must never reach a test either.

The suite's own settings (`BC_TEST_POSTGRES`, `BC_HYPOTHESIS_PROFILE`, …) are left alone. At the end
of the session `changes()` compares the real places with their fingerprint from the start, and the
suite fails if any moved.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

# Inside the real HOME, the places bc writes; the top level of HOME is checked by name only (a tool that
# caches under ~/.cache while the suite runs is not the suite writing there).
BC_PLACES = (".config/bc", ".local/share/bc")
SYSTEM_PLACES = ("/var/lib/bc", "/etc/bc")
IGNORED_TOP_LEVEL = frozenset({".cache"})


def fingerprint(root: Path) -> dict[str, tuple[int, int]]:
    """Every file and directory under root (root included) by path: (size, mtime in ns); empty if absent."""
    if not root.exists() and not root.is_symlink():
        return {}
    out: dict[str, tuple[int, int]] = {}
    for path in [root, *root.rglob("*")] if root.is_dir() else [root]:
        try:
            st = path.lstat()
        except OSError:
            continue
        out[str(path)] = (st.st_size if not path.is_dir() else 0, st.st_mtime_ns)
    return out


def top_level(home: Path) -> frozenset[str]:
    try:
        return frozenset(p.name for p in home.iterdir()) - IGNORED_TOP_LEVEL
    except OSError:
        return frozenset()


@dataclass
class HomeSandbox:
    real_home: Path
    scratch: Path
    saved: dict[str, str | None]
    prints: dict[str, dict[str, tuple[int, int]]] = field(default_factory=dict)
    home_names: frozenset[str] = frozenset()

    @classmethod
    def enter(cls) -> HomeSandbox:
        real_home = Path(os.environ.get("HOME") or Path.home())
        scratch = Path(tempfile.mkdtemp(prefix="bc-test-home-"))
        names = ("HOME", "XDG_CONFIG_HOME", "BC_DATA_DIR", "BC_CONFIG")
        box = cls(real_home=real_home, scratch=scratch, saved={n: os.environ.get(n) for n in names})
        places = [real_home / p for p in BC_PLACES] + [Path(p) for p in SYSTEM_PLACES]
        box.prints = {str(p): fingerprint(p) for p in places}
        box.home_names = top_level(real_home)
        (scratch / "home").mkdir()
        (scratch / "config").mkdir()
        os.environ["HOME"] = str(scratch / "home")
        os.environ["XDG_CONFIG_HOME"] = str(scratch / "config")
        os.environ["BC_DATA_DIR"] = str(scratch / "data")
        os.environ.pop("BC_CONFIG", None)
        return box

    def changes(self) -> list[str]:
        """What moved in the real places since enter(), one phrase each."""
        out = [f"{place} changed" for place, before in self.prints.items() if fingerprint(Path(place)) != before]
        added = sorted(top_level(self.real_home) - self.home_names)
        if added:
            out.append(f"{self.real_home} gained {', '.join(added)}")
        return out

    def leave(self) -> None:
        for name, value in self.saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(self.scratch, ignore_errors=True)
