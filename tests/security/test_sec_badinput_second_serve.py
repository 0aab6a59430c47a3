"""Attack: a second `bc serve` on a data dir that one already serves (an operator's second terminal, a
unit started twice). Both would share the data dir's worker id, so both would hold every singleton lease
under one name and the placement pass, sweeper, liveness and jobs scheduler would run twice on one store.
The second is now refused at once, exit 4 naming the running one's pid, and the first serves on."""

from __future__ import annotations

import subprocess

from tests.e2e.conftest import lab
from tests.e2e.harness import Lab, free_port

__all__ = ["lab"]


def test_a_second_bc_serve_on_the_same_data_dir_exits_4_naming_the_pid(lab: Lab) -> None:
    first = lab.serve()
    second = subprocess.run(
        [lab.bc_path, "serve", "--data-dir", str(lab.server_dir), "--listen", f"127.0.0.1:{free_port()}"],
        capture_output=True,
        text=True,
        env=lab.env,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert second.returncode == 4, (second.returncode, second.stdout[-500:], second.stderr[-1500:])
    (line,) = second.stderr.splitlines()
    assert line.startswith("error: another bc serve") and f"pid {first.popen.pid}" in line, line
    assert first.popen.poll() is None, "the running bc serve stopped"
    assert lab.bc("nodes") == []  # and still answers
