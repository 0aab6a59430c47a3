"""Attack: `bc store copy --from` naming a missing, corrupt or foreign file. The source was opened like a
server's own store: chmodded to 0600, set to WAL (a write into its header), and the target created and
migrated before the source turned out unreadable (exit 5, with a new store left behind). Now the source
is opened read-only and checked first: exit 2 naming the file, the source byte-for-byte and mode as it
was, and nothing created (no target, no -wal or -shm)."""

from __future__ import annotations

import sqlite3
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from bc.cli.main import cli


def listing(d: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), stat.S_IMODE(p.stat().st_mode)) for p in sorted(d.iterdir())}


def make_source(d: Path, kind: str) -> Path:
    src = d / "lab.db"
    if kind == "corrupt":
        src.write_bytes(b"SQLite format 2\x00" + b"\x17" * 8192)
    elif kind == "foreign":  # a real SQLite database, another program's
        conn = sqlite3.connect(src)
        conn.execute("CREATE TABLE notes (body TEXT)")
        conn.commit()
        conn.close()
    if src.exists():
        src.chmod(0o644)
    return src


@pytest.mark.parametrize("kind", ["missing", "corrupt", "foreign"])
@pytest.mark.parametrize("scheme", ["sqlite:", ""])
def test_a_bad_source_is_exit_2_naming_it_and_nothing_is_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, scheme: str
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("BC_DATA_DIR", str(tmp_path / "data"))
    d = tmp_path / "stores"
    d.mkdir()
    src = make_source(d, kind)
    before = listing(d)
    target = d / "fleet.db"
    r = CliRunner().invoke(cli, ["store", "copy", "--from", f"{scheme}{src}", "--to", f"sqlite:{target}"])
    assert r.exit_code == 2, r.output
    (line,) = r.stderr.splitlines()
    assert line.startswith("error: ") and str(src) in line, line
    assert listing(d) == before, "the copy created, wrote or chmodded something"
