"""`bc tui` in a real terminal: tmux runs the installed entry point, `capture-pane` reads the screen,
`send-keys` navigates, `q` quits with exit status 0."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import InprocLab

BC = str(Path(sys.executable).with_name("bc"))


def tmux(sock: str, *args: str) -> str:
    return subprocess.run(["tmux", "-S", sock, *args], check=True, capture_output=True, text=True).stdout


async def screen_shows(sock: str, text: str, timeout: float = 20.0) -> str:
    shown = ""
    try:
        async with asyncio.timeout(timeout):
            while text not in shown:
                await asyncio.sleep(0.1)
                shown = await asyncio.to_thread(tmux, sock, "capture-pane", "-p", "-t", "tui")
    except TimeoutError:
        raise AssertionError(f"the screen never showed {text!r}:\n{shown}") from None
    return shown


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
async def test_bc_tui_in_tmux_shows_the_fleet_navigates_and_quits_with_0(lab: InprocLab, tmp_path: Path) -> None:
    await lab.join("n1")
    await lab.start_node("n1")
    await lab.wait_connected("n1")
    sock = str(tmp_path / "tmux.sock")
    status = tmp_path / "status"
    cmd = f"BC_CONFIG={lab.server.operator_config} TERM=xterm-256color {BC} tui; echo $? > {status}; sleep 30"
    tmux(sock, "new-session", "-d", "-s", "tui", "-x", "120", "-y", "40", cmd)
    try:
        shown = await screen_shows(sock, "n1")
        assert "CONNECTIVITY" in shown and "GEN/APP/OBS" in shown, shown
        await screen_shows(sock, "connected")
        tmux(sock, "send-keys", "-t", "tui", "6")
        await screen_shows(sock, "node.connectivity")
        tmux(sock, "send-keys", "-t", "tui", "?")
        await screen_shows(sock, "never shown as zero")
        tmux(sock, "send-keys", "-t", "tui", "q")  # closes the help
        await screen_shows(sock, "node.connectivity")
        tmux(sock, "send-keys", "-t", "tui", "q")
        async with asyncio.timeout(20):
            while not status.exists() or not status.read_text().strip():
                await asyncio.sleep(0.1)
        assert status.read_text().strip() == "0"
    finally:
        subprocess.run(["tmux", "-S", sock, "kill-server"], check=False, capture_output=True)
