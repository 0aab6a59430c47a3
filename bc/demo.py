"""`make demo`: a local lab on this machine, driven exactly as an operator would drive it.

Starts `bc serve` on the embedded store, joins three fake-hardware nodes with
one-time tokens, places a GPU hold, shows it reach its node as a CDI spec and
the generations converge, releases it, and prints a summary. Everything runs
as subprocesses of the installed `bc`, in `.demo/` (kept afterwards for a look
at the logs and files), and every wait has a deadline.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

NODES = (("n1", "hgx-h100-8"), ("n2", "hgx-h100-8"), ("n3", "mig-a100-4"))


class DemoFailed(Exception):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Tour:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.server = f"127.0.0.1:{self.port}"
        self.bc_path = shutil.which("bc", path=str(Path(sys.executable).parent)) or "bc"
        self.env = dict(os.environ, BC_DATA_DIR=str(root / "server"), HOME=str(root / "home"))
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        (root / "home").mkdir(parents=True)

    def say(self, text: str) -> None:
        print(f"\n== {text}", flush=True)

    def spawn(self, name: str, *args: str) -> None:
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 (lives as long as the process)
        self.procs[name] = subprocess.Popen(
            [self.bc_path, *args], stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )

    def bc(self, *args: str, show: bool = False) -> str:
        r = subprocess.run([self.bc_path, *args], capture_output=True, text=True, env=self.env, timeout=60)
        if r.returncode != 0:
            raise DemoFailed(f"`bc {' '.join(args)}` exited {r.returncode}: {r.stderr.strip()}")
        if show:
            print(f"$ bc {' '.join(args)}")
            print(r.stdout.rstrip())
        return r.stdout

    def bcj(self, *args: str) -> Any:
        return json.loads(self.bc(*args, "--json"))

    def wait(self, what: str, pred: Callable[[], Any], timeout: float = 30.0) -> Any:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            got = pred()
            if got:
                return got
            time.sleep(0.1)
        raise DemoFailed(f"timed out after {timeout:.0f}s waiting for {what}")

    def node(self, node_id: str) -> Any:
        return self.bcj("nodes", "show", node_id)

    def converged(self, node_id: str, generation: int = 1) -> bool:
        n = self.node(node_id)
        return bool(n["state"] == "connected" and n["observed_generation"] == n["generation"] >= generation)

    def _converged_fn(self, node_id: str) -> Callable[[], bool]:
        return lambda: self.converged(node_id)

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()

    def run(self) -> dict[str, Any]:
        t0 = time.monotonic()
        self.say(f"bc serve on {self.server} (embedded SQLite store in {self.root / 'server'})")
        self.spawn(
            "serve",
            "serve",
            "--data-dir",
            str(self.root / "server"),
            "--listen",
            self.server,
            "--heartbeat-interval",
            "2",
        )
        self.wait("bc serve to write the operator config", lambda: (self.root / "server/operator/config.json").exists())
        self.say("one-time join tokens, three nodes join and start their agents on fake GPUs")
        for node_id, profile in NODES:
            token = self.bc("token", "create", "--node-id", node_id, "--ttl", "10m").strip().splitlines()[-1]
            self.bc(
                "join", "--server", self.server, "--token", token, "--data-dir", str(self.root / node_id), show=True
            )
            self.spawn(node_id, "node", "--data-dir", str(self.root / node_id), "--fake-hw", profile)
        for node_id, _ in NODES:
            self.wait(f"{node_id} to connect and converge", self._converged_fn(node_id))
        self.bc("nodes", show=True)

        self.say("a 2-GPU hold on n1: placed, booked, and delivered as a new generation")
        t_res = time.monotonic()
        res = self.bcj("reserve", "--gpus", "2", "--node", "n1")
        print(f"reservation {res['id']}: {[d['atom_id'] for d in res['devices']]} at generation {res['generation']}")
        self.wait("n1 to observe the new generation", lambda: self.converged("n1", res["generation"]))
        took_ms = (time.monotonic() - t_res) * 1000
        cdi = self.root / "n1" / "cdi" / f"bc-{res['allocation_id']}.json"
        self.wait("the CDI spec on n1", cdi.exists)
        doc = json.loads(cdi.read_text())
        print(
            f"CDI spec {cdi.relative_to(self.root)}: kind {doc['kind']}, devices "
            f"{[d['name'] for d in doc['devices']]}, env {doc['containerEdits']['env']}"
        )
        self.wait(
            "the reservation to go active",
            lambda: any(r["id"] == res["id"] and r["state"] == "active" for r in self.bcj("reservations")),
        )
        self.bc("nodes", "show", "n1", show=True)

        self.say("a MIG slice anywhere: the capacity module finds the MIG node")
        mig = self.bcj("reserve", "--gpus", "1", "--class", "gpu.mig")
        print(f"reservation {mig['id']} on {mig['node_id']}: {[d['atom_id'] for d in mig['devices']]}")
        self.wait("the MIG node to converge", lambda: self.converged(mig["node_id"], mig["generation"]))

        self.say("release both: the node removes the CDI specs and reports the devices free")
        self.bc("release", res["id"], show=True)
        self.bc("release", mig["id"], show=True)
        self.wait("the CDI spec to disappear", lambda: not cdi.exists())
        self.wait(
            "both reservations released",
            lambda: all(r["state"] == "released" for r in self.bcj("reservations", "--all")),
        )
        for node_id, _ in NODES:
            self.wait(f"{node_id} to converge", self._converged_fn(node_id))
        self.bc("nodes", show=True)
        events = self.bcj("events", "--limit", "1000")
        return {
            "nodes": len(NODES),
            "reserve_to_observed_ms": round(took_ms),
            "events": len(events),
            "generations": {n: self.node(n)["generation"] for n, _ in NODES},
            "elapsed_s": round(time.monotonic() - t0, 1),
            "lab": str(self.root),
        }


def main() -> int:
    root = Path(os.environ.get("BC_DEMO_DIR", ".demo")).resolve()
    if root.exists():
        shutil.rmtree(root)
    tour = Tour(root)
    try:
        summary = tour.run()
    except (DemoFailed, subprocess.TimeoutExpired) as e:
        print(f"\ndemo failed: {e}\nlogs are in {root}", file=sys.stderr)
        return 1
    finally:
        tour.stop()
    print("\n== summary")
    for k, v in summary.items():
        print(f"  {k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
