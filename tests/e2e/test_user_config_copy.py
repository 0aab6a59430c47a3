"""`bc serve` and `~/.config/bc/config.json`: copied when absent or naming the same data dir, never over
another server's, and the log says which, on every start.

A real `bc serve` in a lab whose HOME is the test's tmp dir: the first start writes the copy; a second
server with another data dir (same HOME) leaves it naming the first and logs why, with the BC_CONFIG
that reaches it; the first server started again rewrites its own copy (a stale CA file is replaced).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .harness import Lab, free_port, port_accepts


def _names(path: Path) -> str:
    return str(json.loads(path.read_text())["data_dir"])


@pytest.mark.e2e
def test_serve_copies_its_config_only_over_its_own_and_logs_which(lab: Lab) -> None:
    user = lab.home / ".config" / "bc" / "config.json"
    lab.serve()
    lab.wait_for("the copy in ~/.config/bc", lambda: user.exists() and "user-copy-written" in lab.log("serve"))
    assert _names(user) == str(lab.server_dir)
    assert f"event=operator-config.user-copy-written path={user} reason='absent'" in lab.log("serve")

    other_dir = lab.root / "other-server"
    lab.serve("other", other_dir, free_port())
    lab.wait_for("the second server's word on the copy", lambda: "user-copy-" in lab.log("other"))
    assert _names(user) == str(lab.server_dir), "a second server replaced the first one's config"
    log = lab.log("other")
    assert "user-copy-written" not in log, log
    assert (
        f"event=operator-config.user-copy-kept path={user} reason=\"names another server's data dir "
        f'({lab.server_dir})" use=BC_CONFIG={other_dir / "operator" / "config.json"}'
    ) in log, log

    # Restarted, the first server rewrites its own copy (as after a certificate rotation): a stale CA goes.
    (user.parent / "ca.crt").write_text("stale\n")
    lab.kill("serve")
    lab.restart("serve")
    lab.wait_for("the copy rewritten", lambda: lab.log("serve").count("user-copy-written") == 2)
    assert (user.parent / "ca.crt").read_bytes() == (lab.server_dir / "operator" / "ca.crt").read_bytes()
    assert "reason='names this data dir (" in lab.log("serve").rsplit("--- lab: start", 1)[1]
    assert lab.bc("nodes", env={"BC_DATA_DIR": ""}) == []  # the admin commands reach it through the copy


@pytest.mark.e2e
def test_the_port_accepts_only_once_the_operator_config_is_written(lab: Lab) -> None:
    """grpc accepts connections as soon as the port is bound: a script that ran `bc nodes` the moment
    `bc serve`'s port accepted found no config (a flake of the restart tests in CI). Polled every
    millisecond, the first accepted connection must find both copies on disk."""
    proc = lab.spawn(
        "serve",
        "serve",
        "--data-dir",
        str(lab.server_dir),
        "--listen",
        f"127.0.0.1:{lab.port}",
        env={"BC_DATA_DIR": str(lab.server_dir)},
    )
    lab.wait_for("the port to accept", lambda: port_accepts(lab.port) or proc.popen.poll() is not None, interval=0.001)
    assert proc.popen.poll() is None, lab.log("serve")
    assert (lab.server_dir / "operator" / "config.json").exists()
    assert (lab.home / ".config" / "bc" / "config.json").exists()
    r = lab.run("nodes")
    assert r.returncode == 0, r
