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
import os
import sys
import traceback
from importlib import metadata
from typing import Any

import click

from bc.cli import (
    admin_cmds,
    capacity_cmds,
    cmd_cmds,
    doctor_cmds,
    job_cmds,
    operator_cmds,
    quorum_cmds,
    release_cmds,
    run_cmds,
    sim_cmds,
    ssh_cmds,
    store_cmds,
    unit_cmds,
)
from bc.cli.output import echo, one_line
from bc.errors import BcError
from tui import command as tui_command

EXIT_INTERRUPTED = 130  # the shell's code for "ended by SIGINT"


def version() -> str:
    try:
        return metadata.version("bc")
    except metadata.PackageNotFoundError:
        return "0.0.0+unknown"


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        from bc.version import build_info  # only when asked: it may run git

        echo(build_info().text())
        ctx.exit(0)


class BcGroup(click.Group):
    """A click group that renders our errors as one sentence and the right exit code."""

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
        traceback.print_exception(e, file=sys.stderr)
    elif unexpected:
        message += " (run with --debug for the traceback)"
    echo("error: " + one_line(" ".join(str(message).split())), err=True)  # one line, whatever the message held


@click.group(cls=BcGroup, name="bc", context_settings={"help_option_names": ["-h", "--help"]})
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


for _command in (
    *run_cmds.COMMANDS,
    *admin_cmds.COMMANDS,
    *capacity_cmds.COMMANDS,
    *cmd_cmds.COMMANDS,
    *job_cmds.COMMANDS,
    *doctor_cmds.COMMANDS,
    *unit_cmds.COMMANDS,
    *quorum_cmds.COMMANDS,
    *operator_cmds.COMMANDS,
    *sim_cmds.COMMANDS,
    *store_cmds.COMMANDS,
    *ssh_cmds.COMMANDS,
    *tui_command.COMMANDS,
    *release_cmds.COMMANDS,
):
    cli.add_command(_command)


def main() -> None:
    """The `bc` entry point."""
    cli(prog_name="bc")


if __name__ == "__main__":
    main()
