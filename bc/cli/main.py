"""`bc`: the click group, and the one place errors become exit codes.

Commands are thin (parse, call a library function, render). Whatever they
raise lands in `BcGroup.invoke`:

* a `BcError` prints `error: <message>` on stderr and exits with its
  `exit_code` (see `bc.errors`);
* click's own usage errors (a bad option value, a missing argument) keep click's
  message, on one line with a pointer to `--help`, and exit 2;
* Ctrl-C exits 130 without a word;
* anything else is a bug or an unexpected failure of the world: one line,
  exit 1, and a hint that `--debug` shows the traceback.

`--debug` (or `BC_DEBUG=1`) adds the traceback to the stderr line.
"""

from __future__ import annotations

import errno
import importlib
import os
import traceback
from collections.abc import Mapping
from typing import Any

import click

from bc.cli.output import echo, one_line, text_lines
from bc.errors import BcError

EXIT_INTERRUPTED = 130  # the shell's code for "ended by SIGINT"

COMMAND_MODULES: dict[str, str] = {
    "serve": "bc.cli.run_cmds",
    "join": "bc.cli.run_cmds",
    "node": "bc.cli.run_cmds",
    "helper": "bc.cli.helper_cmds",
    "token": "bc.cli.admin_cmds",
    "nodes": "bc.cli.admin_cmds",
    "spec": "bc.cli.admin_cmds",
    "events": "bc.cli.admin_cmds",
    "pki": "bc.cli.admin_cmds",
    "reserve": "bc.cli.capacity_cmds",
    "reservations": "bc.cli.capacity_cmds",
    "reservation": "bc.cli.capacity_cmds",
    "capacity": "bc.cli.capacity_cmds",
    "usage": "bc.cli.capacity_cmds",
    "cmd": "bc.cli.cmd_cmds",
    "jobs": "bc.cli.job_cmds",
    "health": "bc.cli.health_cmds",
    "instances": "bc.cli.instance_cmds",
    "doctor": "bc.cli.doctor_cmds",
    "unit": "bc.cli.unit_cmds",
    "version": "bc.cli.unit_cmds",
    "approve": "bc.cli.quorum_cmds",
    "approvers": "bc.cli.quorum_cmds",
    "batch": "bc.cli.quorum_cmds",
    "operators": "bc.cli.operator_cmds",
    "sim": "bc.cli.sim_cmds",
    "store": "bc.cli.store_cmds",
    "ssh": "bc.cli.ssh_cmds",
    "secret": "bc.cli.secret_cmds",
    "metal": "bc.cli.metal_cmds",
    "tunnel": "bc.cli.tunnel_cmds",
    "tunnels": "bc.cli.tunnel_cmds",
    "port-forward": "bc.cli.tunnel_cmds",
    "shell": "bc.cli.tunnel_cmds",
    "exec": "bc.cli.tunnel_cmds",
    "tui": "tui.command",
    "release": "bc.cli.release_cmds",  # wraps admin_cmds' `release RESERVATION`
}
"""Each top-level command and the module whose `COMMANDS` holds it.

A command's module is imported only when that command runs (or `--help` lists
them all): `bc nodes` need not load cryptography's x509, Textual or the
simulator, and a CLI call costs little more than Python and gRPC starting.
tests/unit/cli/test_cli_errors.py checks this table against every module's
`COMMANDS`.
"""


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        from bc.runtime.version import build_info  # only when asked: it may run git

        echo(text_lines(build_info().text()))
        ctx.exit(0)


class BcGroup(click.Group):
    """A click group that renders our errors as one sentence and the right exit code.

    `lazy_commands` (name -> module, as `COMMAND_MODULES`) are loaded on first
    use; those added with `add_command` come first.
    """

    def __init__(self, *args: Any, lazy_commands: Mapping[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_commands: Mapping[str, str] = lazy_commands or {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self.lazy_commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.lazy_commands:
            module = importlib.import_module(self.lazy_commands[cmd_name])
            for command in module.COMMANDS:
                if command.name == cmd_name:
                    self.add_command(command)
        return self.commands.get(cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as e:
            # click's own form is four lines ("Usage: …", "Try …", "", "Error: …"); ours is one.
            where = e.ctx.command_path if e.ctx is not None else "bc"
            _report(ctx, e, f"{e.format_message()} (see `{where} --help`)")
            ctx.exit(e.exit_code)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except BcError as e:
            _report(ctx, e, e.message)
            ctx.exit(e.exit_code)
        except KeyboardInterrupt:
            ctx.exit(EXIT_INTERRUPTED)
        except OSError as e:
            if e.errno == errno.EPIPE:
                raise  # click's main turns a closed pipe (`bc events | head`) into a quiet exit
            _report(ctx, e, _one_line(e), unexpected=True)
            ctx.exit(1)
        except Exception as e:
            _report(ctx, e, _one_line(e), unexpected=True)
            ctx.exit(1)


def _debugging(ctx: click.Context) -> bool:
    return bool(ctx.params.get("debug")) or os.environ.get("BC_DEBUG", "") not in ("", "0")


def _one_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__


def _report(ctx: click.Context, e: BaseException, message: str, *, unexpected: bool = False) -> None:
    if _debugging(ctx):
        echo(text_lines("".join(traceback.format_exception(e))), err=True)
    elif unexpected:
        message += " (run with --debug for the traceback)"
    echo("error: " + one_line(" ".join(str(message).split())), err=True)  # one line, whatever the message held


@click.group(
    cls=BcGroup, name="bc", lazy_commands=COMMAND_MODULES, context_settings={"help_option_names": ["-h", "--help"]}
)
@click.option("--debug", is_flag=True, help="Print the traceback when a command fails.")
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Print the version and exit.",
)
def cli(debug: bool) -> None:
    """bc: an operations toolkit for GPU fleets."""


def main() -> None:
    """The `bc` entry point."""
    from bc.cli.lazy_protobuf import defer_python_message

    defer_python_message()  # before any command's module imports protobuf (a few ms of every call)
    cli(prog_name="bc")


if __name__ == "__main__":
    main()
