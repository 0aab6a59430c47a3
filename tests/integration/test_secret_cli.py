"""`bc secret` against a real `bc serve` (gRPC, mutual TLS, SQLite file): what an operator types and reads.

Values go in through a file, stdin or an environment variable, never from argv, and are never printed
back; bad input is one sentence and a non-zero exit; writes are admin's (docs/secrets.md).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from bc.cli.main import cli
from tests.integration.test_cli_cmd import fails, ok_json
from tests.integration.test_quorum_cli import Lab, as_operator, operator_config, running_lab

VALUE = "authorization=Bearer tok-9f2c1e"


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Lab]:
    yield from running_lab(tmp_path, monkeypatch)


def value_file(tmp_path: Path, text: str = VALUE) -> Path:
    path = tmp_path / "value"
    path.write_text(text)
    return path


def test_set_list_versions_rm_and_the_value_is_never_printed(lab: Lab, tmp_path: Path) -> None:
    doc = ok_json("secret", "set", "otlp-auth", f"@{value_file(tmp_path)}", "--node", "n1", "--label", "pool=a")
    assert doc["version"] == 1 and doc["scope"] == {"nodes": ["n1"], "labels": ["pool=a"]}
    # A rotation from the environment keeps the scope.
    r = CliRunner().invoke(
        cli, ["secret", "set", "otlp-auth", "--from-env", "OTLP_AUTH"], prog_name="bc", env={"OTLP_AUTH": VALUE + "2"}
    )
    assert r.exit_code == 0 and r.stdout.strip() == "secret otlp-auth version 2 set; nodes using it: 0", r.output
    r = CliRunner().invoke(cli, ["secret", "list"], prog_name="bc")
    assert r.exit_code == 0, r.output
    header, row = r.stdout.splitlines()
    assert header.split()[:3] == ["NAME", "VERSION", "SCOPE"] and row.split()[:2] == ["otlp-auth", "2"]
    assert "n1, label pool=a" in row
    versions = ok_json("secret", "versions", "otlp-auth")
    assert [v["version"] for v in versions] == [2, 1] and all(v["set_by"] == "local" for v in versions)
    events = CliRunner().invoke(cli, ["events", "--type", "secret.", "--json"], prog_name="bc")
    everything = (
        r.output
        + json.dumps(versions)
        + json.dumps(ok_json("secret", "list"))
        + events.output
        + CliRunner().invoke(cli, ["secret", "versions", "otlp-auth"], prog_name="bc").output
    )
    assert "tok-9f2c1e" not in everything
    assert ok_json("secret", "rm", "otlp-auth")["name"] == "otlp-auth"
    assert ok_json("secret", "list") == []
    # The at-rest key sits beside the CA, owner-only.
    key = lab.server.opts.data_dir / "pki" / "secrets.key"
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600 and len(key.read_bytes()) == 32


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["secret", "set", "s1", "Bearer-in-argv", "--node", "n1"], "never taken from the command line"),
        (["secret", "set", "s1", "@/nonexistent/value", "--node", "n1"], "cannot read the value file"),
        (["secret", "set", "s1", "--node", "n1"], "exactly one of them"),
        (["secret", "set", "s1", "--from-env", "BC_NO_SUCH_VAR", "--node", "n1"], "no variable 'BC_NO_SUCH_VAR'"),
        (["secret", "set", "Bad Name", "--from-env", "HOME", "--node", "n1"], "bad secret name"),
    ],
)
def test_bad_input_is_one_sentence_before_any_call(args: list[str], says: str) -> None:
    assert says in fails(2, *args)


def test_what_the_server_refuses_is_one_sentence(lab: Lab, tmp_path: Path) -> None:
    assert "no secret named 'nope'" in fails(3, "secret", "versions", "nope")
    assert "no secret named 'nope'" in fails(3, "secret", "rm", "nope")
    path = value_file(tmp_path)
    assert "is new: say which nodes may read it" in fails(2, "secret", "set", "s1", f"@{path}")
    assert "bad label key" in fails(2, "secret", "set", "s1", f"@{path}", "--label", "=x")
    assert "is empty" in fails(2, "secret", "set", "s1", f"@{value_file(tmp_path, '')}", "--node", "n1")


def test_writes_are_an_admins(lab: Lab, tmp_path: Path) -> None:
    ok_json("secret", "set", "s1", f"@{value_file(tmp_path)}", "--node", "n1")
    operator = operator_config(tmp_path, "olive", "operator")
    r = as_operator(operator, "secret", "set", "s1", f"@{value_file(tmp_path)}")
    assert r.exit_code == 6 and "admin" in r.stderr and "setting a secret" in r.stderr, r.output
    r = as_operator(operator, "secret", "rm", "s1")
    assert r.exit_code == 6, r.output
    r = as_operator(operator, "secret", "list", "--json")
    assert r.exit_code == 0 and [s["name"] for s in json.loads(r.stdout)] == ["s1"], r.output
    viewer = operator_config(tmp_path, "vera", "viewer")
    r = as_operator(viewer, "secret", "list")
    assert r.exit_code == 6 and "listing secrets" in r.stderr, r.output
