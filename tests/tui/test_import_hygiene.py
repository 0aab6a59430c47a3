"""Textual loads only for `bc tui`: every other command (and the agent) starts without it."""

from __future__ import annotations

import subprocess
import sys


def loaded_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(' '.join(sorted(m.split('.')[0] for m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_the_cli_and_the_agent_start_without_textual() -> None:
    assert "textual" not in loaded_after("import bc.cli.main")
    assert "textual" not in loaded_after("import agent.app")
    assert "textual" in loaded_after("import tui.app")  # the check can fail: the TUI does load it
