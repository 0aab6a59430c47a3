"""`bc node --helper-socket` and `bc helper`: refusals an operator reads before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from bc.cli.main import cli
from bc.errors import Unavailable
from bc.pki import tokens


@pytest.mark.parametrize("flag", [["--cdi-dir", "/etc/cdi"], ["--ssh-dir", "/etc/ssh/bc"], ["--sshd-reload-cmd", ""]])
def test_a_node_under_the_helper_refuses_the_paths_the_helper_owns(tmp_path: Path, flag: list[str]) -> None:
    r = CliRunner().invoke(cli, ["node", "--data-dir", str(tmp_path), "--helper-socket", str(tmp_path / "s"), *flag])
    assert r.exit_code == 2
    assert r.stderr == f"error: {flag[0]} cannot be used with --helper-socket: bc helper owns those paths\n"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ([], "name the node's user with exactly one of --allow-user or --allow-uid"),
        (["--allow-uid", "0"], "the node's user must not be root"),
        (["--allow-user", "no-such-user-bc"], "there is no user 'no-such-user-bc' on this host"),
    ],
)
def test_the_helper_refuses_to_serve_nobody_or_root(tmp_path: Path, args: list[str], says: str) -> None:
    r = CliRunner().invoke(cli, ["helper", "--socket", str(tmp_path / "s"), "--root", str(tmp_path), *args])
    assert r.exit_code == 2 and r.stderr.startswith(f"error: {says}"), r.stderr
    assert not (tmp_path / "s").exists()


def test_a_node_under_the_helper_takes_no_tcti_the_tpm_is_the_helpers(tmp_path: Path) -> None:
    r = CliRunner().invoke(
        cli, ["node", "--data-dir", str(tmp_path), "--helper-socket", str(tmp_path / "s"), "--tcti", "swtpm:"]
    )
    assert r.exit_code == 2
    assert r.stderr == "error: --tcti cannot be used with --helper-socket: the TPM is bc helper's (bc helper --tcti)\n"


@pytest.mark.parametrize("extra", [[], ["--attestor", "tpm", "--tcti", "swtpm:"]])
def test_a_join_names_the_helper_only_for_a_tpm_it_reaches_no_other_way(tmp_path: Path, extra: list[str]) -> None:
    args = ["join", "--server", "h:1", "--token", "t", "--data-dir", str(tmp_path), "--helper-socket", "/run/s"]
    r = CliRunner().invoke(cli, [*args, *extra])
    assert r.exit_code == 2
    assert r.stderr.startswith("error: --helper-socket names where an unprivileged node's TPM is: use it with")


def test_a_tpm_join_whose_helper_is_down_says_so_in_one_sentence(tmp_path: Path) -> None:
    token = tokens.format_token("0123456789ab", b"s" * 32, "sha256:" + "ab" * 32)
    args = ["join", "--server", "127.0.0.1:1", "--token", token, "--data-dir", str(tmp_path / "d")]
    r = CliRunner().invoke(cli, [*args, "--attestor", "tpm", "--helper-socket", str(tmp_path / "gone.sock")])
    assert r.exit_code == Unavailable.exit_code
    assert r.stderr == f"error: helper: cannot reach {tmp_path / 'gone.sock'}: No such file or directory\n"
