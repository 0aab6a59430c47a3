"""One composition root: nothing under bc/ or agent/ outside bc/assembly/ starts a control-plane loop itself.

Every loop a control-plane process runs is listed once, in `bc.assembly.loops.LOOPS`, and started under
one `Supervisor` by `start_loops` (restarted when it raises, its state reported to `bc doctor`). A loop
started by hand elsewhere (`asyncio.create_task(liveness.run_forever(clock))`) would die for good on the
first store outage, unseen, and would differ between `bc serve`, the harness and `bc sim`. This check
(run by `make lint` and by tests/unit/assembly/test_check_wiring.py) reads the source's syntax trees and
fails on any module outside bc/assembly/ that:

* calls `start_loops` or constructs a `Supervisor` (except the seam-passing callers `SEAM_CALLERS`, the
  harness and `bc sim`'s gateways, which build their parts with `build_control` and hand them over);
* names a loop's entry point (`ENTRY_POINTS`): called or passed on (`functools.partial(x.run_forever, …)`
  starts it as surely as a call does), on any receiver: the method names are the loops' own;
* calls or passes `.run` of a `ClockSkewMonitor` or `ServeTelemetry` (a receiver built there, or named
  `…clock_skew…`/`…skew_monitor…`/`serve_telemetry`: `.run` alone is too common a name to forbid);
* spawns a loop on a supervisor by hand (`.spawn` on a receiver named `…supervisor…`), the seam callers
  included: what they run is the table's, through `start_loops`.

A definition (`def run_forever`) is not a start. tests/ and bench/ are not checked: a test drives one
loop's step on purpose. Usage: `python build/check_wiring.py [ROOT]`; exit 1 with one line per violation.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ("bc", "agent")
ASSEMBLY = "bc/assembly/"
SEAM_CALLERS = frozenset({"bc/sim/pair.py", "bc/sim/gateways.py"})
"""May call `start_loops` and construct the `Supervisor` it needs (they pass seams), never run a loop."""

ENTRY_POINTS: dict[str, str] = {
    "spec-signer": "run_forever",  # SpecSigner.run_forever
    "trust-publish": "publish_forever",  # bc.control.trust.sources.publish_forever
    "gateway-lease": "lease_loop",  # Gateway.lease_loop
    "revocation-feed": "revocation_loop",  # Gateway.revocation_loop
    "gateway-stats": "stats_loop",  # Gateway.stats_loop
    "liveness": "run_forever",  # Liveness.run_forever
    "command-sweeper": "run_forever",  # CommandSweeper.run_forever
    "jobs": "run_forever",  # JobEngine.run_forever
    "placement": "run_forever",  # PlacementPass.run_forever
    "health": "run_forever",  # HealthReconciler.run_forever
    "clock-skew": "run",  # ClockSkewMonitor.run (see RUN_OWNERS)
    "telemetry": "run",  # ServeTelemetry.run (see RUN_OWNERS)
}
"""The entry point of each loop in `bc.assembly.loops.LOOPS` that a module outside bc/assembly/ could reach.
The others (`api-registry`, `gateway-registry`, `keyless`) are `Server`'s private methods. The unit test fails when the
table gains a loop this map does not name."""
SERVE_ONLY = frozenset({"api-registry", "gateway-registry", "keyless"})

NAMED = frozenset(v for v in ENTRY_POINTS.values() if v != "run")
RUN_OWNERS = frozenset({"ClockSkewMonitor", "ServeTelemetry"})
RUN_RECEIVER_HINTS = ("clock_skew", "skew_monitor", "serve_telemetry")
STARTERS = frozenset({"start_loops", "Supervisor"})


@dataclass(frozen=True)
class Violation:
    path: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what} (a control-plane loop starts only in bc/assembly: start_loops)"


def _last_name(node: ast.expr) -> str:
    """`a.b.c` -> `c`, `c` -> `c`, `C(...)` -> `C`; anything else: ''."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Call):
        return _last_name(node.func)
    return ""


def _run_of_an_owner(node: ast.Attribute) -> bool:
    recv = node.value
    if isinstance(recv, ast.Call) and _last_name(recv.func) in RUN_OWNERS:
        return True
    name = _last_name(recv).lower()
    return any(h in name for h in RUN_RECEIVER_HINTS)


def violations_in(source: str, rel: str) -> Iterator[Violation]:
    """The violations in one module's source; `rel` is its path from the root, with forward slashes."""
    if rel.startswith(ASSEMBLY):
        return
    tree = ast.parse(source, filename=rel)
    seam = rel in SEAM_CALLERS
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and not seam:
            callee = _last_name(node.func)
            if callee in STARTERS:
                yield Violation(rel, node.lineno, f"calls {callee}")
        elif isinstance(node, ast.Attribute):
            if node.attr in NAMED:
                yield Violation(rel, node.lineno, f"starts a loop: .{node.attr}")
            elif node.attr == "run" and _run_of_an_owner(node):
                yield Violation(rel, node.lineno, f"starts a loop: {_last_name(node.value)}.run")
            elif node.attr == "spawn" and "supervisor" in _last_name(node.value).lower():
                yield Violation(rel, node.lineno, f"spawns a loop by hand: {_last_name(node.value)}.spawn")
        elif isinstance(node, ast.Name) and node.id in NAMED and isinstance(node.ctx, ast.Load):
            yield Violation(rel, node.lineno, f"starts a loop: {node.id}")
        elif isinstance(node, ast.ImportFrom) and not seam:
            for alias in node.names:
                if alias.name in NAMED | {"start_loops"}:
                    yield Violation(rel, node.lineno, f"imports {alias.name}")


def check(root: Path = ROOT) -> list[Violation]:
    """Every violation under root's bc/ and agent/ (tests/ and bench/ are not checked)."""
    found: list[Violation] = []
    for top in CHECKED:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            found.extend(violations_in(path.read_text("utf-8"), rel))
    return found


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else ROOT
    found = check(root)
    for v in found:
        print(v)
    if found:
        print(f"check_wiring: {len(found)} violation(s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
