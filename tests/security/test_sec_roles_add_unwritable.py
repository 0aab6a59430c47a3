"""Attack (on the admin's own mistake): `bc operators add eve --out F` where F cannot be written. The server
must not be left with an operator whose only key was lost with the file, a live certificate nobody holds.
The key reaches F before the operator is committed: an unwritable F is refused exit 2 and no operator is made."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_cli_cmd import bc, ok_json
from tests.integration.test_quorum_cli import refused
from tests.security.roles_helpers import Lab, operators, serve_lab


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Lab]:
    yield from serve_lab(tmp_path, monkeypatch)


def test_operators_add_into_an_unwritable_path_leaves_no_operator(lab: Lab, tmp_path: Path) -> None:
    # sysfs takes no new file, even from root (the tests run as root in CI, where a 0500 directory is writable).
    out = Path("/sys") / f"bc-sec-roles-{os.getpid()}.bc-config.json"
    assert out.parent.is_dir() and not out.exists()
    refused(bc("operators", "add", "eve", "--out", str(out)), 2, f"cannot write {out}")
    assert set(operators()) == {"local"}
    assert not [e for e in ok_json("events", "--type", "operator.") if e["subject"] == "eve"]
    assert not out.exists()
    # The name was never used: the same add to a writable path works.
    good = tmp_path / "eve.bc-config.json"
    assert ok_json("operators", "add", "eve", "--out", str(good))["config"] == str(good)
    assert operators()["eve"]["revoked"] is False
