"""The CLI's long-running clients across a `bc serve` restart (issue 30), with real processes only.

`bc serve` is killed (SIGKILL) and started again on the same data dir and port while:

* `bc events --follow --json` runs: it says on stderr that the server is not answering and when it
  is back, and prints every event of the log exactly once, in order, across the restart;
* the `--wait` loops run (`bc cmd run --wait`, `bc cmd fanout --wait`, `bc jobs run`,
  `bc reserve --wait`), each waiting on a node that is not up yet: each goes on waiting through the
  restart and exits 0 once the node has come up and done the work.

And a server that is down is reported as down: `bc nodes` against it exits 5 with
`bc serve at ADDR is not answering (connection refused)`, and a listener that resets each connection
says `(connection reset)`/`(connection closed)`, not a refused certificate; only a server that refuses
the operator certificate (another cluster's) is exit 6 naming the certificate.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .harness import Lab


@dataclass
class Client:
    """A `bc` subprocess whose stdout and stderr go to separate files, read while it runs."""

    popen: subprocess.Popen[bytes]
    out: Path
    err: Path

    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def stop(self) -> int:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGINT)
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=10)
        return self.popen.returncode


def start(lab: Lab, name: str, *args: str) -> Client:
    out, err = lab.root / f"{name}.out", lab.root / f"{name}.err"
    with out.open("wb") as o, err.open("wb") as e:
        popen = subprocess.Popen(
            [lab.bc_path, *args], stdin=subprocess.DEVNULL, stdout=o, stderr=e, env=lab.env, start_new_session=True
        )
    return Client(popen, out, err)


@contextlib.contextmanager
def clients(*cs: Client) -> Iterator[None]:
    try:
        yield
    finally:
        for c in cs:
            c.stop()


def printed_seqs(c: Client) -> list[int]:
    return [json.loads(line)["seq"] for line in c.stdout().splitlines() if line.strip()]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["killed", "stopped"])
def test_events_follow_reconnects_and_prints_each_event_once_across_a_restart(lab: Lab, sig: int) -> None:
    lab.serve()
    lab.token("before")
    follow = start(lab, "follow", "events", "--follow", "--json")
    with clients(follow):
        lab.wait_for("the follow to print the first token", lambda: '"before"' in follow.stdout())
        lab.kill("serve", sig)
        lab.wait_for(
            "the follow to say the server is not answering",
            lambda: f"bc serve at {lab.address} is not answering (connection refused)" in follow.stderr(),
        )
        assert follow.popen.poll() is None, f"the follow exited {follow.popen.returncode}: {follow.stderr()}"
        lab.restart("serve")
        lab.wait_for("the follow to say the server is back", lambda: "is answering again" in follow.stderr())
        lab.token("after")
        lab.wait_for("the follow to print the token made after the restart", lambda: '"after"' in follow.stdout())
        assert follow.popen.poll() is None
    log = [e["seq"] for e in lab.bc("events", "--limit", "10000")]
    seqs = printed_seqs(follow)
    assert seqs == log[: len(seqs)], "every event once, in order, none skipped"
    assert seqs[-1] >= max(e["seq"] for e in lab.events("token.") if "after" in json.dumps(e))


def test_the_wait_loops_go_on_waiting_through_a_restart(lab: Lab) -> None:
    lab.serve()
    lab.join("n1")
    lab.node("n1")
    lab.wait_for("n1 to connect", lambda: lab.show("n1")["state"] == "connected")
    lab.kill("node-n1")  # known to the fleet, not running: every wait below waits on it
    run = start(lab, "run", "cmd", "run", "n1", "inventory.refresh", "--wait", "--json")
    fanout = start(lab, "fanout", "cmd", "fanout", "inventory.refresh", "--nodes", "n1", "--wait", "--json")
    reserve = start(lab, "reserve", "reserve", "--gpus", "1", "--wait", "--json")
    job = start(lab, "job", "jobs", "run", "reboot", "n1", "--json")
    waits = {"cmd run": run, "cmd fanout": fanout, "reserve": reserve, "jobs run": job}
    with clients(*waits.values()):
        lab.wait_for("the command, the fan-out and the job to be queued", lambda: len(lab.bc("cmd", "list")) >= 2)
        lab.wait_for("the DAG to be submitted", lambda: lab.bc("jobs", "list"))
        lab.wait_for("the reservation to be booked", lambda: lab.bc("reservations"))
        lab.kill("serve")
        for name, c in waits.items():
            lab.wait_for(f"`bc {name}` to say the server is not answering", lambda c=c: "not answering" in c.stderr())
            assert c.popen.poll() is None, f"`bc {name}` exited {c.popen.returncode}: {c.stderr()}"
        lab.restart("serve")
        lab.restart("node-n1")
        for name, c in waits.items():
            try:
                code = c.popen.wait(timeout=90)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"`bc {name}` still waits: {c.stderr()[-2000:]}") from None
            assert code == 0, f"`bc {name}` exited {code}: {c.stderr()[-2000:]}"
            assert "is answering again" in c.stderr(), c.stderr()
    assert json.loads(run.stdout())["state"] == "succeeded"
    assert [c["state"] for c in json.loads(fanout.stdout())] == ["succeeded"]
    assert json.loads(reserve.stdout())["state"] == "active"
    assert json.loads(job.stdout())["state"] == "done"


def test_a_server_that_is_down_is_not_answering_exit_5(lab: Lab) -> None:
    lab.serve()
    lab.kill("serve")
    r = lab.run("nodes")
    assert r.returncode == 5, r
    assert r.stderr.strip() == f"error: bc serve at {lab.address} is not answering (connection refused)"


@contextlib.contextmanager
def resetting_listener(port: int) -> Iterator[None]:
    """A TCP listener on `port` that resets every connection it accepts (a server dying under its clients)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(16)
    stop = threading.Event()

    def serve() -> None:
        sock.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            conn.close()  # linger 0: an RST, as from a process killed mid-handshake

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join(timeout=5)
        sock.close()


def test_a_connection_reset_is_not_answering_not_a_refused_certificate(lab: Lab) -> None:
    lab.serve()
    lab.kill("serve")
    with resetting_listener(lab.port):
        r = lab.run("nodes")
    assert r.returncode == 5, r
    assert r.stderr.startswith(f"error: bc serve at {lab.address} is not answering (connection "), r.stderr
    assert "certificate" not in r.stderr


def test_a_server_that_refuses_the_operator_certificate_is_exit_6(lab: Lab, tmp_path: Path) -> None:
    lab.serve()
    other = Lab(tmp_path / "other")
    try:
        other.serve()
    finally:
        other.close()
    # Our CA and server; another cluster's operator certificate and key.
    ours, theirs = lab.server_dir / "operator", other.server_dir / "operator"
    doc = json.loads((ours / "config.json").read_text())
    doc.update(ca=str(ours / doc["ca"]), cert=str(theirs / doc["cert"]), key=str(theirs / doc["key"]))
    cfg = tmp_path / "mixed.json"
    cfg.write_text(json.dumps(doc))
    r = lab.run("nodes", env={"BC_CONFIG": str(cfg)})
    assert r.returncode == 6, r
    assert f"bc serve at {lab.address} refused the operator certificate" in r.stderr, r.stderr
