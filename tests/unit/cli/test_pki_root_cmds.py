"""`bc pki root export` and `bc pki root remove`, against a real data dir's signing keys."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from bc.cli.main import cli
from bc.pki.secrets_source import SeededSecrets
from bc.pki.signing import SigningKeys
from bc.testing import virtual_clock


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    d = tmp_path / "server"
    SigningKeys.create(d / "pki", virtual_clock(1_800_000_000.0), random.Random(1), SeededSecrets(1))
    return d


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def root(d: Path) -> Path:
    return d / "pki" / "signing" / "root.key"


def test_export_then_remove_keeps_the_key_in_the_export_only(data_dir: Path, tmp_path: Path) -> None:
    key = root(data_dir).read_bytes()
    out = tmp_path / "offline" / "root.key"
    out.parent.mkdir()
    r = run("pki", "root", "export", "--out", str(out), "--data-dir", str(data_dir))
    assert r.exit_code == 0, r.output
    assert out.read_bytes() == key and out.stat().st_mode & 0o777 == 0o600
    r = run("pki", "root", "remove", "--exported", str(out), "--data-dir", str(data_dir))
    assert r.exit_code == 0, r.output
    assert not root(data_dir).exists() and out.read_bytes() == key
    keys = SigningKeys.load(data_dir / "pki")  # the worker key and the root certificate stay
    assert keys.root_signer() is None
    # Exporting again finds no root here: one sentence, nothing written.
    again = tmp_path / "again.key"
    r = run("pki", "root", "export", "--out", str(again), "--data-dir", str(data_dir))
    assert r.exit_code == 2 and not again.exists()
    assert r.stderr.count("\n") == 1 and "kept elsewhere" in r.stderr


def test_export_never_overwrites_a_file(data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "exists.key"
    out.write_bytes(b"something precious")
    r = run("pki", "root", "export", "--out", str(out), "--data-dir", str(data_dir))
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "already exists" in r.stderr
    assert out.read_bytes() == b"something precious"


def test_remove_refuses_without_a_matching_export_and_removes_nothing(data_dir: Path, tmp_path: Path) -> None:
    key = root(data_dir).read_bytes()
    missing = tmp_path / "never-exported.key"
    r = run("pki", "root", "remove", "--exported", str(missing), "--data-dir", str(data_dir))
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "export the root first" in r.stderr
    other = tmp_path / "other.key"
    other.write_bytes(b"not the root")
    r = run("pki", "root", "remove", "--exported", str(other), "--data-dir", str(data_dir))
    assert r.exit_code == 2 and "nothing was removed" in r.stderr
    assert root(data_dir).read_bytes() == key


def test_a_dir_without_signing_keys_is_refused(tmp_path: Path) -> None:
    r = run("pki", "root", "export", "--out", str(tmp_path / "x.key"), "--data-dir", str(tmp_path / "empty"))
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "holds no command-signing keys" in r.stderr
    assert not (tmp_path / "x.key").exists()
