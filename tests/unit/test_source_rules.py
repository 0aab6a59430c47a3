"""Rules about our own source that a linter does not know.

* Input is checked with `fullmatch`, never `match`: `re.match(r"^[a-z]+$", "n9\\n")` succeeds, because
  `$` matches before a trailing newline, so an id with a newline once passed a check that looked anchored.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("bc", "agent")


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
