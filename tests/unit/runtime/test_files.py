"""The one way bc writes a file: whole or not at all (`atomic_write`), or new and never over one (`write_new`)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from bc.runtime import files
from bc.runtime.files import TMP_PREFIX, atomic_write, write_new


def test_write_new_creates_the_file_private_and_synced_with_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[Path] = []
    real = files.fsync_dir
    monkeypatch.setattr(files, "fsync_dir", lambda p: (synced.append(Path(p)), real(p)))
    out = tmp_path / "root.key"
    write_new(out, b"secret")
    assert out.read_bytes() == b"secret"
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert synced == [tmp_path]  # the new name survives a power cut, not only the bytes


def test_write_new_never_writes_over_a_file(tmp_path: Path) -> None:
    out = tmp_path / "config.json"
    out.write_bytes(b"theirs")
    with pytest.raises(FileExistsError):
        write_new(out, b"ours")
    assert out.read_bytes() == b"theirs"


def test_a_failed_write_new_leaves_no_partial_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full_disk(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    out = tmp_path / "export.key"
    with pytest.raises(OSError):
        write_new(out, b"secret")
    assert not out.exists()


def test_atomic_write_replaces_whole_and_leaves_no_temporary(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "spec.json"
    atomic_write(out, b"one")
    atomic_write(out, b"two", 0o600)
    assert out.read_bytes() == b"two"
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert not [p for p in out.parent.iterdir() if p.name.startswith(TMP_PREFIX)]
