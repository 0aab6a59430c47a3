"""The rule that tells the POSIX calculator's invocations from ours, and the search that skips ourselves.

The processes themselves (the installed artifact handing `echo 1+1 | bc` to the system's calculator) are
tested in tests/e2e/test_calculator_passthrough.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bc.cli import posix_bc
from bc.cli.main import COMMAND_MODULES
from bc.cli.posix_bc import find_calculator, is_calculator_call, is_calculator_flag, own_paths


def test_the_command_names_are_the_clis_commands() -> None:
    assert frozenset(COMMAND_MODULES) == posix_bc.COMMAND_NAMES


@pytest.mark.parametrize(
    ("argv", "terminal", "is_file", "calculator"),
    [
        ([], False, False, True),  # echo 1+1 | bc
        ([], True, False, False),  # bc on a terminal: our help
        (["-l"], True, False, True),
        (["-l"], False, False, True),
        (["-lq"], False, False, True),
        (["-q", "-l", "x.bc"], False, False, True),
        (["--mathlib"], False, False, True),
        (["-s"], False, False, True),
        (["-w"], False, False, True),
        (["-i"], True, False, True),
        (["script.bc"], True, True, True),
        (["script.bc"], True, False, False),  # no such file: ours, a usage error naming it
        (["nodes"], False, True, False),  # a file called `nodes` in the cwd does not take the command
        (["nodes", "--help"], False, False, False),
        (["--help"], False, False, False),
        (["-h"], False, False, False),
        (["--version"], False, False, False),
        (["--debug", "nodes"], False, False, False),
        (["-x"], False, False, False),
        (["-lx"], False, False, False),
        (["--json"], False, True, False),
        (["-"], False, True, False),
    ],
)
def test_whose_call(argv: list[str], terminal: bool, is_file: bool, calculator: bool) -> None:
    assert is_calculator_call(argv, stdin_is_terminal=terminal, is_file=is_file) is calculator


@given(
    st.sampled_from(sorted(posix_bc.COMMAND_NAMES | posix_bc.OUR_OPTIONS)),
    st.lists(st.text(max_size=8), max_size=4),
    st.booleans(),
    st.booleans(),
)
def test_our_commands_and_options_are_always_ours(first: str, rest: list[str], terminal: bool, is_file: bool) -> None:
    assert not is_calculator_call([first, *rest], stdin_is_terminal=terminal, is_file=is_file)


@given(st.text(alphabet="lqswi", min_size=1, max_size=5), st.lists(st.text(max_size=8), max_size=3), st.booleans())
def test_every_run_of_calculator_letters_is_the_calculators(letters: str, rest: list[str], terminal: bool) -> None:
    assert is_calculator_flag("-" + letters)
    assert is_calculator_call(["-" + letters, *rest], stdin_is_terminal=terminal)


def _exe(path: Path, text: str = "#!/bin/sh\nexit 0\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_the_search_skips_this_program_through_a_symlink_and_the_skip_list(tmp_path: Path) -> None:
    ours = _exe(tmp_path / "usr/local/bin/bc")
    link = tmp_path / "bin-link/bc"
    link.parent.mkdir()
    link.symlink_to(ours)
    other_copy = _exe(tmp_path / "opt/bin/bc")  # a second copy of ours, which handed the call to us
    system = _exe(tmp_path / "usr/bin/bc")
    path = os.pathsep.join(str(p.parent) for p in (link, ours, other_copy, system))

    mine = own_paths(str(link), sys.executable, False, {"PATH": path, posix_bc.SKIP_ENV: str(other_copy)})
    assert mine == {str(ours.resolve()), str(other_copy.resolve())}
    assert find_calculator(path, mine) == str(system)
    assert find_calculator(os.pathsep.join(str(p.parent) for p in (link, ours, other_copy)), mine) is None

    # Typed as `bc`, the shell ran the first one on PATH; a frozen binary also knows its own file.
    assert own_paths("bc", str(other_copy), True, {"PATH": path}) == {str(ours.resolve()), str(other_copy.resolve())}


def test_the_entry_imports_neither_click_nor_protobuf_before_the_hand_off(tmp_path: Path) -> None:
    """`echo 1+1 | bc` pays for Python's start-up and no more: the hand-off runs before bc's imports."""
    calculator = _exe(
        tmp_path / "usr/bin/bc", '#!/bin/sh\necho "calculator $* $BC_PROBE_MODULES"\n'
    )  # prints what the parent process had imported, passed through its environment
    probe = (
        "import os, sys\n"
        "from bc.cli.entry import main\n"
        "heavy = sorted(m for m in ('click', 'grpc', 'google.protobuf', 'bc.cli.main') if m in sys.modules)\n"
        "os.environ['BC_PROBE_MODULES'] = ','.join(heavy) or 'none'\n"
        "sys.argv = ['/nowhere/bc', '-l']\n"
        "main()\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        env={**os.environ, "PATH": str(calculator.parent)},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == "calculator -l none\n"
