"""Attack (on the operator's terminal, by construction): a TUI widget fed a string a node or an operator supplied
without `tui.fmt` (a `Static(reason)`, a DataTable cell, a log line, a toast) draws its control and bidi
characters raw and reads its Rich markup (`[link=…]`, `[red]…[/]`, an unclosed `[` that stops the app).

Every text the TUI shows goes through `tui.fmt` (escapes and makes a markup-inert `Safe`), and the widgets of
`tui.shown` take only that. This walks every module of `tui/` and fails on a widget or call that draws text
(`Static`, `Label`, `Text`, `Hit`, `.update`, `.add_row`, `.update_cell`, `.write`, `.notify`, `Input(value=…)`)
given anything but a literal constant or a `tui.fmt` result, and on markup escaping or raw rich text made
anywhere but `tui/fmt.py` and `tui/shown.py` (where the escaping and the sinks live).
"""

from __future__ import annotations

import ast
from pathlib import Path

import tui

TUI = Path(tui.__file__).parent
SINKS_LIVE_IN = {"fmt.py", "shown.py"}  # the escaping writer and the widgets that take only its output

# Calls that draw their text arguments (by the called name, a function or a method): which positional ones
# (None: all of them; Input draws only its keywords, a Hit its display, a cell update its value).
DRAWS: dict[str, tuple[int, ...] | None] = {
    "Static": None,
    "Label": None,
    "Button": None,
    "Text": None,
    "Content": None,
    "from_markup": None,
    "assemble": None,
    "Hit": (1,),
    "update": None,
    "add_row": None,
    "add_rows": None,
    "update_cell": (2,),
    "write": (0,),
    "notify": (0,),
    "Input": (),
}
TEXT_KWARGS = {"content", "renderable", "label", "help", "message", "text", "value", "placeholder", "title", "prompt"}
# Modules that make raw rich text or escape markup: only tui/fmt.py and tui/shown.py may use them.
RAW_TEXT_MODULES = {"rich.markup", "textual.markup", "rich.text", "textual.content"}


def _called_name(call: ast.Call) -> str:
    f = call.func
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Attribute):
        return f.attr
    return ""


def _is_fmt_call(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "fmt"
    )


def _fmt_names(fn: ast.AST) -> set[str]:
    """Names a function binds only to `fmt.…(…)` results (`body = fmt.block(…)`)."""
    made: set[str] = set()
    other: set[str] = set()
    for node in ast.walk(fn):
        targets: list[ast.expr] = []
        value: ast.expr | None = None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.withitem, ast.NamedExpr)):
            t = getattr(node, "target", None) or getattr(node, "optional_vars", None)
            targets = [t] if t is not None else []
        for t in targets:
            if isinstance(t, ast.Name):
                (made if value is not None and _is_fmt_call(value) else other).add(t.id)
    return made - other


def _acceptable(arg: ast.expr, made: set[str]) -> bool:
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return True  # the code's own words
    if _is_fmt_call(arg):
        return True
    if isinstance(arg, ast.Name) and arg.id in made:
        return True
    # The palette's highlighter reads markup: it is given fmt.markup's output.
    return (
        isinstance(arg, ast.Call) and _called_name(arg) == "highlight" and all(_acceptable(a, made) for a in arg.args)
    )


def violations(source: str, name: str) -> list[str]:
    tree = ast.parse(source, name)
    out: list[str] = []
    scopes: list[ast.AST] = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    made_in: dict[int, set[str]] = {}
    for fn in scopes:
        names = _fmt_names(fn)
        for node in ast.walk(fn):
            made_in.setdefault(id(node), set()).update(names)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in RAW_TEXT_MODULES:
            out.append(f"{name}:{node.lineno}: imports {node.module} (raw text or markup escaping outside tui/fmt.py)")
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in RAW_TEXT_MODULES:
                    out.append(f"{name}:{node.lineno}: imports {alias.name} (outside tui/fmt.py)")
        if isinstance(node, ast.Attribute) and node.attr == "escape" and ast.unparse(node.value).endswith("markup"):
            out.append(f"{name}:{node.lineno}: markup escaping outside tui/fmt.py ({ast.unparse(node)})")
        if not isinstance(node, ast.Call) or _called_name(node) not in DRAWS:
            continue
        made = made_in.get(id(node), set())
        which = DRAWS[_called_name(node)]
        args = [a for i, a in enumerate(node.args) if which is None or i in which]
        args += [k.value for k in node.keywords if k.arg in TEXT_KWARGS]
        args += [k.value for k in node.keywords if k.arg is None]  # **kwargs: unknown, so not acceptable
        for a in args:
            if not _acceptable(a, made):
                out.append(
                    f"{name}:{node.lineno}: {ast.unparse(node)[:120]} draws {ast.unparse(a)[:60]!r}, not fmt-made"
                )
    return out


def tui_modules() -> list[Path]:
    return sorted(p for p in TUI.rglob("*.py") if p.name not in SINKS_LIVE_IN or p.parent != TUI)


def test_no_tui_widget_draws_text_that_tui_fmt_did_not_make() -> None:
    found = [v for p in tui_modules() for v in violations(p.read_text(), str(p.relative_to(TUI.parent)))]
    assert not found, "text reaches a widget without tui.fmt:\n" + "\n".join(found)


def test_the_rule_catches_what_it_is_about() -> None:
    """The walker itself: each way a raw string reached a widget before is found (so the test above can fail)."""
    bad = """
from rich.markup import escape
def f(self, b, e):
    yield Static(f"[b]{b.id}[/b]", markup=True)
    self.query_one(Static).update(b.reason)
    t.add_row(b.id, escape(b.used))
    self.notify(f"cannot approve: {e.message}")
    log.write(Text(b.data_json))
    yield Input(value=b.path)
    body = b.reason
    ConfirmScreen.update(body)
"""
    found = violations(bad, "bad.py")
    for line in (2, 4, 5, 6, 7, 8, 9, 11):
        assert any(v.startswith(f"bad.py:{line}:") for v in found), (line, found)
    good = """
def f(self, b):
    body = fmt.block([b.reason])
    yield Static("a constant", classes="title")
    self.notify("not connected")
    self.query_one(Shown).update(body)
    yield Hit(1, matcher.highlight(fmt.markup(b.id)), help=fmt.markup(b.kind))
"""
    assert violations(good, "good.py") == []
