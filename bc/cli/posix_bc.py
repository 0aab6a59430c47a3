"""`bc` is also the POSIX calculator: which invocations are the calculator's, and where it is.

The documented install puts this program at `/usr/local/bin/bc`, ahead of the
system's `/usr/bin/bc` on PATH, and shell scripts everywhere call that one
(`echo '1+1' | bc`, `bc -l`, `bc script.bc`). The rule (`is_calculator_call`)
picks the calculator's invocations by their form, so neither program needs a
new name:

| invocation | whose |
| --- | --- |
| no arguments, stdin not a terminal (`echo 1+1 \\| bc`) | the calculator's |
| no arguments on a terminal | ours (`bc --help`) |
| first argument one of our commands, or `--help`/`-h`/`--version`/`--debug` | ours |
| first argument a calculator flag: `-l -q -s -w -i`, alone or run together (`-lq`) | the calculator's |
| first argument a GNU bc long flag: `--mathlib --quiet --standard --warn --interactive` | the calculator's |
| first argument an existing file that is not one of our command names (`bc script.bc`) | the calculator's |
| anything else (`bc nodez`) | ours: a usage error naming the command |

A calculator invocation is handed to the first `bc` on PATH that is not this
program (`find_calculator`), with the same arguments, stdin and environment,
by `exec` (same pid, so a pipe's exit status is the calculator's). "Not this
program" is by real path: ours as it was invoked (`sys.argv[0]`, and
`sys.executable` for the one-file binary), and every path in
`$BC_CALCULATOR_SKIP`, to which we add our own before the exec, so two copies
of this program on one PATH never hand the call to each other in a loop. With
no calculator installed it says so in one line and exits 127 (the shell's
"command not found").

This module runs before anything else of bc's (`bc.cli.entry`): it imports
`os` and `sys` only, so `echo 1+1 | bc` costs a Python start-up and no more.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping, Sequence

COMMAND_NAMES: frozenset[str] = frozenset(
    {
        "approve",
        "approvers",
        "batch",
        "capacity",
        "cmd",
        "doctor",
        "events",
        "exec",
        "health",
        "instances",
        "helper",
        "jobs",
        "join",
        "metal",
        "node",
        "nodes",
        "operators",
        "pki",
        "port-forward",
        "release",
        "reservation",
        "reservations",
        "reserve",
        "secret",
        "serve",
        "shell",
        "sim",
        "spec",
        "ssh",
        "store",
        "token",
        "tui",
        "tunnel",
        "tunnels",
        "unit",
        "usage",
        "version",
    }
)
"""Our top-level commands: `bc.cli.main.COMMAND_MODULES`'s keys (a unit test keeps the two equal; this
module must not import click to learn them)."""

OUR_OPTIONS: frozenset[str] = frozenset({"--help", "-h", "--version", "--debug"})
CALCULATOR_LETTERS = frozenset("lqswi")
CALCULATOR_LONG: frozenset[str] = frozenset({"--mathlib", "--quiet", "--standard", "--warn", "--interactive"})
SKIP_ENV = "BC_CALCULATOR_SKIP"
NOT_FOUND_EXIT = 127


def is_calculator_flag(arg: str) -> bool:
    """`-l`, `-lq`, `--mathlib`: a flag of POSIX (or GNU) bc."""
    if arg in CALCULATOR_LONG:
        return True
    return len(arg) >= 2 and arg[0] == "-" and arg[1] != "-" and set(arg[1:]) <= CALCULATOR_LETTERS


def is_calculator_call(argv: Sequence[str], *, stdin_is_terminal: bool, is_file: bool = False) -> bool:
    """Whether `bc ARGV` is a calculator invocation (the table in this module's docstring).

    `is_file`: whether `argv[0]` names an existing file (asked only when it matters, by the caller).
    """
    if not argv:
        return not stdin_is_terminal
    first = argv[0]
    if first in COMMAND_NAMES or first in OUR_OPTIONS:
        return False
    if is_calculator_flag(first):
        return True
    return not first.startswith("-") and is_file


def own_paths(argv0: str, executable: str, frozen: bool, env: Mapping[str, str]) -> set[str]:
    """The real paths that are this program: as invoked, the one-file binary itself, and the skip list."""
    paths = {os.path.realpath(p) for p in env.get(SKIP_ENV, "").split(os.pathsep) if p}
    if os.sep in argv0:
        paths.add(os.path.realpath(argv0))
    else:  # typed as `bc`: the shell ran the first one on PATH
        first = next(iter(candidates(argv0, env.get("PATH", ""))), None)
        if first:
            paths.add(os.path.realpath(first))
    if frozen:
        paths.add(os.path.realpath(executable))
    return paths


def candidates(name: str, path: str) -> Iterable[str]:
    """Every executable file called `name` on `path`, in PATH order."""
    for d in path.split(os.pathsep):
        full = os.path.join(d or ".", name)
        if os.path.isfile(full) and os.access(full, os.X_OK):
            yield full


def find_calculator(path: str, mine: set[str]) -> str | None:
    """The first `bc` on `path` that is not one of `mine` (real paths)."""
    for full in candidates("bc", path):
        if os.path.realpath(full) not in mine:
            return full
    return None


def not_found_message(argv: Sequence[str]) -> str:
    shown = " ".join(["bc", *argv]) if argv else "bc (reading stdin)"
    return (
        f"bc: `{shown}` is a call to the POSIX calculator, and none is installed besides this bc, "
        "the GPU fleet toolkit: install the OS's bc package (apt-get install bc, dnf install bc); "
        "`bc --help` lists this bc's commands"
    )


def hand_off(argv: Sequence[str]) -> None:
    """Exec the system calculator when `argv` is its invocation; return otherwise (the call is ours)."""
    first_is_file = bool(argv) and not argv[0].startswith("-") and os.path.isfile(argv[0])
    try:
        terminal = os.isatty(0)
    except OSError:  # no stdin at all
        terminal = False
    if not is_calculator_call(argv, stdin_is_terminal=terminal, is_file=first_is_file):
        return
    env = dict(os.environ)
    mine = own_paths(sys.argv[0], sys.executable, bool(getattr(sys, "frozen", False)), env)
    calculator = find_calculator(env.get("PATH", ""), mine)
    if calculator is None:
        sys.stderr.write(not_found_message(argv) + "\n")
        sys.stderr.flush()
        os._exit(NOT_FOUND_EXIT)  # nothing of ours started: no atexit work to run
    env[SKIP_ENV] = os.pathsep.join(sorted(mine))
    sys.stdout.flush()
    os.execve(calculator, ["bc", *argv], env)


__all__ = [
    "COMMAND_NAMES",
    "find_calculator",
    "hand_off",
    "is_calculator_call",
    "is_calculator_flag",
    "own_paths",
]
