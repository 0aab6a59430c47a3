"""How `bc` fails: one sentence on stderr, the error's exit code, a traceback only when asked."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner, Result

from bc.cli.main import BcGroup
from bc.errors import Conflict


@click.group(cls=BcGroup)
@click.option("--debug", is_flag=True)
def app(debug: bool) -> None:
    """A group with our error handling and commands that fail on purpose."""


@app.command()
def conflict() -> None:
    raise Conflict("node n1 has 0 free gpu atoms; 2 asked")


@app.command()
def crash() -> None:
    raise RuntimeError("the disk is on fire\nsecond line")


@app.command()
def interrupted() -> None:
    raise KeyboardInterrupt


@app.command()
@click.option("--count", type=int, required=True)
def typed(count: int) -> None:
    click.echo(count)


def run(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


@pytest.fixture(autouse=True)
def _no_debug_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BC_DEBUG", raising=False)


def test_a_bc_error_exits_with_its_code_and_one_line() -> None:
    result = run("conflict")
    assert result.exit_code == 4
    assert result.stderr == "error: node n1 has 0 free gpu atoms; 2 asked\n"
    assert result.stdout == ""


def test_an_unexpected_exception_is_one_line_and_exit_1() -> None:
    result = run("crash")
    assert result.exit_code == 1
    assert result.stderr == "error: RuntimeError: the disk is on fire (run with --debug for the traceback)\n"


def test_debug_shows_the_traceback() -> None:
    result = run("--debug", "crash")
    assert result.exit_code == 1
    assert result.stderr.startswith("Traceback (most recent call last):")
    assert result.stderr.rstrip().endswith("error: RuntimeError: the disk is on fire")


def test_bc_debug_env_shows_the_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BC_DEBUG", "1")
    result = run("conflict")
    assert result.exit_code == 4
    assert "Traceback" in result.stderr


def test_ctrl_c_exits_130_quietly() -> None:
    result = run("interrupted")
    assert result.exit_code == 130
    assert result.stderr == ""


def test_click_usage_errors_keep_clicks_exit_2() -> None:
    result = run("typed", "--count", "many")
    assert result.exit_code == 2
    assert "Invalid value for '--count'" in result.stderr


def test_the_lazy_command_table_names_every_command_of_every_cli_module_and_only_those() -> None:
    """`bc` loads a command's module when it runs: the table must match what each module's COMMANDS holds,
    or a command would be missing from `bc --help` or load from the wrong module."""
    import importlib

    from bc.cli.main import COMMAND_MODULES, cli

    for module_name in sorted(set(COMMAND_MODULES.values())):
        module = importlib.import_module(module_name)
        for command in module.COMMANDS:
            if module_name == "bc.cli.admin_cmds" and command.name == "release":
                continue  # wrapped by bc.cli.release_cmds' `release` group
            assert COMMAND_MODULES.get(str(command.name)) == module_name, command.name
    ctx = click.Context(cli)
    for name in COMMAND_MODULES:
        command = cli.get_command(ctx, name)
        assert command is not None and command.name == name
