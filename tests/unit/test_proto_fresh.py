"""Build hygiene: the generated wire modules match proto/, and the agent builds from the contract alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_modules_are_fresh() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "build" / "gen_proto.py"), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, f"generated modules are stale (run `make proto`):\n{proc.stderr}"


def test_the_agent_does_not_import_the_control_plane() -> None:
    code = "import json, sys\nimport agent.app\nprint(json.dumps(sorted(sys.modules)))\n"
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    modules = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "agent.app" in modules
    forbidden = ("bc.store", "bc.control", "bc.gateway", "textual")
    leaked = [m for m in modules if any(m == f or m.startswith(f + ".") for f in forbidden)]
    assert leaked == []
