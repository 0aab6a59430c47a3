"""Attack: a string a node or an operator supplied reaches a terminal by a path that does not escape it.

`bc.cli.output` is the one writer (it escapes every control and bidi character, and a string prints as
one line); this walks the syntax tree of every module under bc/ (the TUI is tested on its own) and fails
on any other way to the terminal: `print(`, `sys.stdout` / `sys.stderr` (their `.write`, or handed to
something as a file), `click.echo` / `secho` / `confirm` / `prompt`, a `rich` console, `traceback.print_*`,
`logging.basicConfig` (a handler on stderr). What may, and why, is the explicit list below.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

EXEMPT: dict[str, str] = {
    "bc/cli/output.py": "the escaping writer itself",
    "bc/cli/posix_bc.py": "hands the POSIX calculator's bytes through untouched, by design (`echo 1+1 | bc`)",
    "bc/runtime/logs.py": "the log handler on stderr: its formatter escapes each record to one line",
    "bc/cli/demo.py": "`make demo`: a developer's tour of a lab it builds itself from fixed names",
    "bc/sim/fleet.py": "`python -m bc.sim.fleet`: a seeded simulator run's digest and counts, for developers",
    "bc/sim/pair.py": "`python -m bc.sim.pair`: a seeded run's event digest, for developers",
}

CLICK_WRITERS = frozenset({"echo", "secho", "confirm", "prompt", "echo_via_pager", "edit", "pause"})
TRACEBACK_WRITERS = frozenset({"print_exception", "print_exc", "print_last", "print_stack", "print_tb"})


def _dotted(node: ast.expr) -> str:
    """`a.b.c` for a chain of names and attributes, else ""."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def terminal_writes(source: str) -> list[tuple[int, str]]:
    """(line, what) for every way to the terminal in `source` other than `bc.cli.output`."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("print", "pprint"):
            found.append((node.lineno, f"{node.func.id}("))
        elif isinstance(node, ast.Attribute):
            name = _dotted(node)
            head, _, last = name.rpartition(".")
            if (
                name in ("sys.stdout", "sys.stderr", "sys.__stdout__", "sys.__stderr__", "logging.basicConfig")
                or (head == "click" and last in CLICK_WRITERS)
                or (head == "traceback" and last in TRACEBACK_WRITERS)
            ):
                found.append((node.lineno, name))
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            for alias in node.names:
                if (
                    (node.module == "sys" and alias.name in ("stdout", "stderr"))
                    or (node.module == "click" and alias.name in CLICK_WRITERS)
                    or (node.module == "traceback" and alias.name in TRACEBACK_WRITERS)
                    or (node.module == "pprint" and alias.name == "pprint")
                ):
                    found.append((node.lineno, f"from {node.module} import {alias.name}"))
        if isinstance(node, ast.Import | ast.ImportFrom):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found += [(node.lineno, f"import {m}") for m in modules if m == "rich" or m.startswith("rich.")]
    return sorted(found)


def modules() -> list[Path]:
    return sorted((ROOT / "bc").rglob("*.py"))


def test_nothing_under_bc_writes_to_the_terminal_but_the_escaping_writer() -> None:
    offenders = [
        f"{rel}:{line}: {what}"
        for path in modules()
        if (rel := path.relative_to(ROOT).as_posix()) not in EXEMPT
        for line, what in terminal_writes(path.read_text(encoding="utf-8"))
    ]
    assert offenders == [], "write through bc.cli.output.echo instead:\n" + "\n".join(offenders)


def test_the_exemptions_are_real_and_still_needed() -> None:
    for rel in EXEMPT:
        path = ROOT / rel
        assert path.is_file(), f"{rel} is exempt but no longer exists"
        assert terminal_writes(path.read_text(encoding="utf-8")), f"{rel} is exempt but writes nothing itself"


def test_the_rule_sees_each_way_to_the_terminal() -> None:
    """Each form the rule names is found (a rule that found nothing would pass on anything)."""
    samples = {
        "print('x')": "print(",
        "import sys\nsys.stdout.write('x')": "sys.stdout",
        "import sys\nsys.stderr.write('x')": "sys.stderr",
        "import logging, sys\nlogging.StreamHandler(sys.stderr)": "sys.stderr",
        "from sys import stdout": "from sys import stdout",
        "import click\nclick.echo('x')": "click.echo",
        "import click\nclick.secho('x')": "click.secho",
        "import click\nclick.confirm('x?')": "click.confirm",
        "from click import echo": "from click import echo",
        "from rich.console import Console": "import rich.console",
        "import rich": "import rich",
        "import traceback\ntraceback.print_exc()": "traceback.print_exc",
        "import logging\nlogging.basicConfig()": "logging.basicConfig",
    }
    for source, what in samples.items():
        assert [w for _, w in terminal_writes(source)] == [what], source
    assert terminal_writes("from bc.cli.output import echo\necho('x')\nlog.info('x')") == []
