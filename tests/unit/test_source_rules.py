"""Rules about our own source that a linter does not know.

* Input is checked with `fullmatch`, never `match`: `re.match(r"^[a-z]+$", "n9\\n")` succeeds, because
  `$` matches before a trailing newline, so an id with a newline once passed a check that looked anchored.
* Every SQL string of the control plane lives in `bc/store` (ARCHITECTURE.md §4), so the statements both
  engines must run are in one place. The agent's journal is its own store and is not under this rule.
* The CLI prints only through `bc.cli.output.echo`, which escapes control and bidi characters.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("bc", "agent", "tui")


def _sources() -> list[Path]:
    out: list[Path] = []
    for pkg in PACKAGES:
        out += [p for p in (ROOT / pkg).rglob("*.py") if "_pb2" not in p.name]
    return out


def _match_calls(tree: ast.AST) -> list[int]:
    """Lines that call `re.match(...)` or `<compiled pattern>.match(...)`."""
    lines = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr != "match":
            continue
        target = node.func.value
        # `re.match` or a module-level pattern constant (`_NODE_ID.match`, `NODE_ID.match`).
        if isinstance(target, ast.Name) and (target.id == "re" or target.id.lstrip("_").isupper()):
            lines.append(node.lineno)
    return lines


def test_the_sources_are_found() -> None:
    assert len(_sources()) > 50


def test_no_regex_match_only_fullmatch() -> None:
    offenders = []
    for path in _sources():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        offenders += [f"{path.relative_to(ROOT)}:{line}" for line in _match_calls(tree)]
    assert not offenders, "use fullmatch (or search) instead of match: " + ", ".join(offenders)


def test_the_rule_catches_what_it_is_for() -> None:
    bad = ast.parse('import re\nNODE = re.compile("x")\nNODE.match("x")\nre.match("x", "y")\n')
    assert _match_calls(bad) == [3, 4]
    good = ast.parse('import re\nNODE = re.compile("x")\nNODE.fullmatch("x")\n')
    assert _match_calls(good) == []


_SQL = re.compile(
    r"\b(SELECT\s.+\sFROM|INSERT INTO|UPDATE \w+ SET|DELETE FROM|SAVEPOINT|BEGIN IMMEDIATE|CREATE TABLE)\b", re.S
)

# The control plane's SQL lives in bc/store, all of it. (The agent's own journal, agent/, is not the
# control plane's store and is not scanned; the simulator's file journal relays the agent's statements.)
SQL_ALLOWED: set[str] = set()


def _sql_lines(tree: ast.AST) -> list[int]:
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and _SQL.search(node.value)
    ]


def test_sql_lives_in_bc_store() -> None:
    offenders = []
    for path in (ROOT / "bc").rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("bc/store/") or rel in SQL_ALLOWED:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
        offenders += [f"{rel}:{line}" for line in _sql_lines(tree)]
    assert not offenders, "move these statements into bc/store: " + ", ".join(offenders)


def test_the_sql_rule_catches_what_it_is_for() -> None:
    tree = ast.parse('q = "SELECT a FROM t"\nw = "UPDATE nodes SET x = 1"\nok = "select the node"\ns = "SAVEPOINT x"\n')
    assert _sql_lines(tree) == [1, 2, 4]


def _echo_calls(tree: ast.AST) -> list[int]:
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("echo", "secho")
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "click"
    ]


def test_the_cli_prints_through_one_writer() -> None:
    offenders = []
    for path in (ROOT / "bc" / "cli").rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "bc/cli/output.py":
            continue
        offenders += [f"{rel}:{line}" for line in _echo_calls(ast.parse(path.read_text(encoding="utf-8")))]
    assert not offenders, "print with bc.cli.output.echo, not click.echo: " + ", ".join(offenders)
