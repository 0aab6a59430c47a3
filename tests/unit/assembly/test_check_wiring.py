"""`build/check_wiring.py` (in `make lint`): no module outside bc/assembly starts a control-plane loop itself."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from bc.assembly.loops import LOOPS

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "build" / "check_wiring.py"


def _checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_wiring", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve the module by name
    spec.loader.exec_module(mod)
    return mod


cw = _checker()


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, "utf-8")
    (tmp_path / "agent").mkdir(exist_ok=True)
    return tmp_path


def run(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), str(root)], capture_output=True, text=True, check=False)


def test_the_repository_passes() -> None:
    done = run(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("source", "what"),
    [
        (
            "import asyncio\nasync def f(liveness, clock):\n    asyncio.create_task(liveness.run_forever(clock))\n",
            ".run_forever",
        ),
        (
            "import functools\ndef f(p, clock):\n    return functools.partial(p.sweeper.run_forever, clock)\n",
            ".run_forever",
        ),
        ("from bc.control.trust.sources import publish_forever\n", "publish_forever"),
        ("async def f(gw):\n    await gw.lease_loop()\n", ".lease_loop"),
        ("async def f(gw):\n    await gw.revocation_loop()\n", ".revocation_loop"),
        ("async def f(gw):\n    await gw.stats_loop()\n", ".stats_loop"),
        (
            "from bc.control.doctor.clock_skew import ClockSkewMonitor\n"
            "async def f(s, c):\n    await ClockSkewMonitor(s, c).run()\n",
            "ClockSkewMonitor.run",
        ),
        ("async def f(self):\n    await self.clock_skew.run()\n", "clock_skew.run"),
        ("from bc.assembly.supervisor import Supervisor\ndef f(c, r):\n    return Supervisor(c, r)\n", "Supervisor"),
        (
            "from bc.assembly import loops\ndef f(s, p):\n    loops.start_loops(s, {'worker'}, set(), p)\n",
            "start_loops",
        ),
    ],
)
def test_a_planted_violation_fails_the_check(tmp_path: Path, source: str, what: str) -> None:
    root = _tree(tmp_path, {"bc/__init__.py": "", "bc/control/rogue.py": source})

    done = run(root)

    assert done.returncode == 1
    assert "bc/control/rogue.py:" in done.stdout and what in done.stdout, done.stdout


def test_the_assembly_and_tests_are_not_checked_and_a_definition_is_not_a_start(tmp_path: Path) -> None:
    starts = "async def f(x):\n    await x.liveness.run_forever(x.clock)\n"
    root = _tree(
        tmp_path,
        {
            "bc/assembly/loops.py": starts,
            "tests/unit/test_x.py": starts,
            "bench/b.py": starts,
            "bc/control/nodes/liveness.py": "class Liveness:\n    async def run_forever(self, clock):\n        pass\n",
            "agent/app.py": "async def f(self):\n    await self.telemetry.run(self.stopped)\n",  # the agent's own
        },
    )
    assert run(root).returncode == 0


def test_the_seam_callers_may_start_loops_but_not_run_one(tmp_path: Path) -> None:
    allowed = (
        "from bc.assembly.loops import start_loops\nfrom bc.assembly.supervisor import Supervisor\n"
        "def f(c, r, p):\n    start_loops(Supervisor(c, r), {'worker'}, set(), p)\n"
    )
    root = _tree(tmp_path, {"bc/sim/pair.py": allowed, "bc/sim/gateways.py": allowed})
    assert run(root).returncode == 0

    (root / "bc/sim/gateways.py").write_text(allowed + "async def g(gw):\n    await gw.lease_loop()\n", "utf-8")
    done = run(root)
    assert done.returncode == 1 and "bc/sim/gateways.py:6" in done.stdout

    (root / "bc/sim/pair.py").write_text(allowed + "def g(self, f):\n    self.supervisor.spawn('extra', f)\n", "utf-8")
    done = run(root)
    assert "bc/sim/pair.py:6: spawns a loop by hand: supervisor.spawn" in done.stdout


def test_every_loop_of_the_table_has_its_entry_point_named() -> None:
    """A loop added to `LOOPS` must be added to the checker too, or a hand-started copy would go unseen."""
    assert {lp.name for lp in LOOPS} == set(cw.ENTRY_POINTS) | cw.SERVE_ONLY
