"""Finding the operator config (bc.runtime.config): an explicit BC_CONFIG is that file or an error, never a fall-back;
the one-file config `bc operators add` writes loads like the data dir's own."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from bc.errors import UsageError
from bc.runtime.config import OperatorConfig, find_operator_config

PEMS = {
    "ca_pem": b"-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n",
    "cert_pem": b"-----BEGIN CERTIFICATE-----\nME\n-----END CERTIFICATE-----\n",
    "key_pem": b"-----BEGIN PRIVATE KEY-----\nKEY\n-----END PRIVATE KEY-----\n",
}


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A data dir config that a fall-back would find: the one another cluster's shell might have."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("BC_CONFIG", raising=False)
    monkeypatch.setenv("BC_DATA_DIR", str(tmp_path / "other-cluster"))
    OperatorConfig.write(
        tmp_path / "other-cluster" / "operator", server="other:7443", data_dir=tmp_path / "other-cluster", **PEMS
    )
    return tmp_path


def test_without_bc_config_the_data_dirs_config_is_found(home: Path) -> None:
    assert find_operator_config().server == "other:7443"


@pytest.mark.parametrize("what", ["missing", "a directory"])
def test_bc_config_naming_no_file_is_an_error_not_the_other_clusters_config(
    home: Path, monkeypatch: pytest.MonkeyPatch, what: str
) -> None:
    path = home / "nope.json"
    if what == "a directory":
        path.mkdir()
    monkeypatch.setenv("BC_CONFIG", str(path))
    with pytest.raises(UsageError) as e:
        find_operator_config()
    assert e.value.exit_code == 2
    assert e.value.message == f"BC_CONFIG names {path}, which is not a file; fix BC_CONFIG or unset it"


@pytest.mark.parametrize("text", ["", "[1]", '{"server": "x"}', '{"server": "x", "ca": 1, "cert": 2, "key": 3}'])
def test_a_bc_config_that_does_not_hold_a_config_is_an_error(
    home: Path, monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    path = home / "bad.json"
    path.write_text(text)
    monkeypatch.setenv("BC_CONFIG", str(path))
    with pytest.raises(UsageError, match=f"the operator config {path} is unreadable"):
        find_operator_config()


def test_the_one_file_config_loads_with_its_pems_inline(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = home / "bob.bc-config.json"
    OperatorConfig.write_single(path, server="here:7443", **PEMS)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert set(json.loads(path.read_text())) == {"server", "ca", "cert", "key", "data_dir"}
    monkeypatch.setenv("BC_CONFIG", str(path))
    cfg = find_operator_config()
    assert (cfg.server, cfg.ca_pem, cfg.cert_pem, cfg.key_pem, cfg.path) == (
        "here:7443",
        PEMS["ca_pem"],
        PEMS["cert_pem"],
        PEMS["key_pem"],
        path,
    )


def test_the_one_file_config_never_overwrites(home: Path) -> None:
    path = home / "bob.bc-config.json"
    path.write_text("mine")
    with pytest.raises(UsageError, match="already exists; refusing to overwrite it"):
        OperatorConfig.write_single(path, server="here:7443", **PEMS)
    assert path.read_text() == "mine"
    with pytest.raises(UsageError, match="cannot write"):
        OperatorConfig.write_single(home / "no-such-dir" / "x.json", server="here:7443", **PEMS)
