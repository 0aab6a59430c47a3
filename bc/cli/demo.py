"""`make demo`: a local lab on this machine, driven exactly as an operator would drive it.

Starts `bc serve` on the embedded store, joins three fake-hardware nodes with
one-time tokens, places a GPU hold, shows it reach its node as a CDI spec and
the generations converge, releases it, runs commands on every lane, shows a
forged command refused by its node (every command and spec is signed), a
node revoked and ejected, named operators with roles (a viewer refused a
write), a GPU-reset batch that waits for two of three approvers (each signing
under their own operator's certificate) and runs exactly once, a threshold
change that itself needs two approvals, and prints a summary. Everything runs
as subprocesses of the installed `bc`, in `.demo/` (kept afterwards for a look
at the logs and files), and every wait has a deadline.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
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
        self.args: dict[str, tuple[list[str], dict[str, str] | None]] = {}
        (root / "home").mkdir(parents=True)

    def say(self, text: str) -> None:
        print(f"\n== {text}", flush=True)

    def spawn(self, name: str, *args: str, env: dict[str, str] | None = None) -> None:
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 (lives as long as the process)
        self.procs[name] = subprocess.Popen(
            [self.bc_path, *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**self.env, **(env or {})},
            start_new_session=True,
        )
        self.args[name] = (list(args), env)

    def kill9(self, name: str) -> None:
        p = self.procs.pop(name)
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)

    def respawn(self, name: str, env: dict[str, str] | None = None) -> None:
        args, _ = self.args[name]
        self.spawn(name, *args, env=env)

    def cmd(self, node_id: str, kind: str, payload: str = "", wait: bool = True) -> Any:
        args = ["cmd", "run", node_id, kind] + (["--payload", payload] if payload else [])
        c = self.bcj(*args)
        if not wait:
            return c
        final = self.wait(f"{kind} on {node_id} to settle", lambda: self._settled(c["id"]), timeout=60)
        print(
            f"{kind:<18} on {node_id}  lane {final['lane']:<9} -> {final['state']}"
            + (f" ({final['reason']})" if final["reason"] else "")
        )
        return final

    def _settled(self, command_id: str) -> Any:
        c = self.bcj("cmd", "show", command_id)
        return c if c["state"] in ("succeeded", "failed", "rejected", "cancelled", "expired") else None

    def bc(self, *args: str, show: bool = False, config: Path | None = None) -> str:
        """`bc ARGS` as the local admin, or as the person whose client config is `config`."""
        env = {**self.env, "BC_CONFIG": str(config)} if config else self.env
        r = subprocess.run([self.bc_path, *args], capture_output=True, text=True, env=env, timeout=60)
        if r.returncode != 0:
            raise DemoFailed(f"`bc {' '.join(args)}` exited {r.returncode}: {r.stderr.strip()}")
        if show:
            who = f"BC_CONFIG={config.name} " if config else ""
            print(f"$ {who}bc {' '.join(args)}")
            print(r.stdout.rstrip())
        return r.stdout

    def bcj(self, *args: str, config: Path | None = None) -> Any:
        return json.loads(self.bc(*args, "--json", config=config))

    def refused(self, *args: str, config: Path) -> str:
        """`bc ARGS` as that person, expected to be refused; returns its one error line."""
        env = {**self.env, "BC_CONFIG": str(config)}
        r = subprocess.run([self.bc_path, *args], capture_output=True, text=True, env=env, timeout=60)
        if r.returncode == 0:
            raise DemoFailed(f"`bc {' '.join(args)}` as {config.name} was not refused")
        error = [line for line in r.stderr.splitlines() if line.startswith("error: ")][-1]
        print(f"$ BC_CONFIG={config.name} bc {' '.join(args)}   # exit {r.returncode}")
        print(error)
        return error

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

    def forge_command(self, node_id: str, gpu_uuid: str) -> str:
        """What an attacker with write access to the store, but no worker key, could do: queue a command
        whose body is their own and whose signature is copied from a genuine one."""
        from google.protobuf import any_pb2

        from bc.protocol.pb import kinds_pb2, session_pb2
        from bc.seams.clock import SystemClock
        from bc.seams.ids import ulid
        from bc.store import tamper

        now_ms = round(SystemClock().now() * 1000)  # the forger's own clock, outside any bc process
        cid = ulid(now_ms / 1000, random.Random(now_ms))  # the forger's own id: unique enough, by time
        payload = any_pb2.Any()
        payload.Pack(kinds_pb2.GpuResetRequest(gpu_uuids=[gpu_uuid]))

        def body(seq: int) -> bytes:
            return session_pb2.CommandBody(
                id=cid,
                node_id=node_id,
                seq=seq,
                kind="gpu.reset",
                payload=payload,
                lane=session_pb2.CONTROL,
                not_after_ms=now_ms + 600_000,
                idempotency_key=f"forged:{cid}",
                attested=True,
            ).SerializeToString(deterministic=True)

        tamper.forge_command(
            self.root / "server" / "bc.db", node_id, cid, "gpu.reset", "control", now_ms + 600_000, now_ms, body
        )
        return cid

    def _held_k(self, node_id: str) -> int:
        """The k in the trust bundle the node holds (identity.json, written whole by the agent)."""
        import base64

        from bc.protocol.pb import common_pb2

        doc = json.loads((self.root / node_id / "identity.json").read_text())
        return common_pb2.TrustBundle.FromString(base64.b64decode(doc.get("trust_bundle_b64", ""))).quorum_k

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
            # n2's fake GPUs take 5 s to reset, so the tour can kill its agent in the middle of one.
            env = {"BC_FAKE_GPU_RESET_S": "5"} if node_id == "n2" else None
            self.spawn(node_id, "node", "--data-dir", str(self.root / node_id), "--fake-hw", profile, env=env)
        for node_id, _ in NODES:
            self.wait(f"{node_id} to connect and converge", self._converged_fn(node_id))
        self.bc("nodes", show=True)
        self.say("every command and spec is signed by a worker key the nodes' trust bundle roots")
        self.bc("pki", "show", show=True)

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

        self.say("one-shot commands on every lane (delivered at least once, run at most once)")
        self.cmd("n1", "inventory.refresh")
        self.cmd("n1", "diag.nvml")
        self.cmd("n3", "logs.collect")
        self.cmd("n1", "diag.dcgm", '{"level": 1}')  # provision lane; dcgmi is not installed here
        self.cmd("n1", "gpu.reset", '{"gpu_uuids": []}')  # a bad payload fails cleanly
        reboot = self.cmd("n3", "node.reboot")

        self.say("kill -9 an agent in the middle of a gpu.reset, then restart it")
        gpu = self.node("n2")["inventory"]["gpus"][0]["uuid"]
        c = self.cmd("n2", "gpu.reset", json.dumps({"gpu_uuids": [gpu]}), wait=False)
        self.wait("the reset to start", lambda: self.bcj("cmd", "show", c["id"])["state"] == "running")
        print(f"gpu.reset {c['id']} is running on n2: kill -9 the agent")
        self.kill9("n2")
        self.respawn("n2")
        final = self.wait("the journal's verdict", lambda: self._settled(c["id"]), timeout=60)
        print(
            f"after the restart: {final['state']} ({final['reason']}): a reset is not retry-safe, so the journal "
            "reports it interrupted and never runs it again"
        )
        self.bc("cmd", "list", show=True)

        self.say("signed intent: a forged gpu.reset, written straight into the store, is refused by the node")
        forged = self.forge_command("n1", self.node("n1")["inventory"]["gpus"][0]["uuid"])
        print(f"queued {forged} in the store with a stolen signature (no worker key): the gateway relays it verbatim")
        refused = self.wait("the node's answer", lambda: self._settled(forged))
        from agent.hw.fake import FakeHardware

        resets = FakeHardware.read_resets(self.root / "n1")
        if resets:
            raise DemoFailed(f"a forged command reset GPUs on n1: {resets}")
        print(f"n1 answered: {refused['state']} {refused['reason']}; its GPU reset count is still {resets or 0}")
        self.bc("events", "--type", "security.", show=True)

        self.say("revoke n3: its session ends within seconds and its agent stops dialing")
        t_rev = time.monotonic()
        self.bc("nodes", "revoke", "n3", "--reason", "demo: decommissioned", show=True)
        self.wait("n3 to be out", lambda: self.node("n3")["state"] != "connected", timeout=10)
        revoked_s = time.monotonic() - t_rev
        self.wait("n3's agent to exit", lambda: self.procs["n3"].poll() is not None, timeout=15)
        print(f"n3 out after {revoked_s:.1f} s; its agent exited with {self.procs['n3'].returncode}")
        self.bc("nodes", show=True)

        self.say("named operators: each person gets a client config with a role; a viewer reads and writes nothing")
        viewer = self.root / "dana.bc-config.json"
        self.bc("operators", "add", "dana", "--role", "viewer", "--out", str(viewer), show=True)
        print(f"dana sees {len(self.bcj('nodes', config=viewer))} nodes")
        viewer_refused = self.refused("reserve", "--gpus", "1", config=viewer)

        self.say("the destructive-batch quorum: three people, each an operator with an approver key; any two sign")
        keys: dict[str, Path] = {}
        configs: dict[str, Path] = {}
        for name in ("alice", "bob", "carol"):
            configs[name] = self.root / f"{name}.bc-config.json"
            self.bc("operators", "add", name, "--role", "operator", "--out", str(configs[name]))
            key = self.root / f"{name}.key"
            pub = self.bcj("approve", "keygen", "--out", str(key))["public_key"]
            change = self.bcj("approvers", "add", name, pub).get("change") or {}
            if change.get("state") == "pending":
                # With approvers present the set changes only with their approvals, each under their own certificate.
                print(f"adding {name} is quorum change {change['id']}: {change['summary']}")
                for signer in keys:
                    done = self.bcj(
                        "approve", "sign", change["id"], "--key", str(keys[signer]), "--yes", config=configs[signer]
                    )
                    print(f"  {signer} signs: {done['approvals']} of {done['threshold']}, {done['state']}")
                    if done["state"] == "applied":
                        break
            keys[name] = key
        self.bc("approvers", show=True)
        uuids = [self.node(n)["inventory"]["gpus"][1]["uuid"] for n in ("n1", "n2")]
        payload = self.root / "reset.json"
        payload.write_text(json.dumps({"gpu_uuids": uuids}))
        batch = self.bcj(
            "batch",
            "create",
            "--kind",
            "gpu.reset",
            "--nodes",
            "n1,n2",
            "--payload",
            f"@{payload}",
            "--reason",
            "demo: XID 79 on both nodes",
        )
        bid = batch["id"]
        self.bc("approve", "list", show=True)
        stolen = self.refused("approve", "sign", bid, "--key", str(keys["alice"]), "--yes", config=configs["bob"])
        self.bc("approve", "sign", bid, "--key", str(keys["alice"]), "--yes", show=True, config=configs["alice"])
        held = [self.bcj("cmd", "show", leaf["command_id"])["state"] for leaf in batch["leaves"]]
        print(f"with one approval the batch's commands are still {held}")
        self.bc("approve", "sign", bid, "--key", str(keys["bob"]), "--yes", show=True, config=configs["bob"])
        for leaf in batch["leaves"]:
            cid = str(leaf["command_id"])
            done = self.wait(f"the reset on {leaf['node_id']}", partial(self._settled, cid))
            print(f"{leaf['node_id']}: gpu.reset {done['state']}")
        from agent.hw.fake import FakeHardware

        counts = {n: FakeHardware.read_resets(self.root / n) for n in ("n1", "n2")}
        ran_once = all(counts[n].get(u) == 1 for n, u in zip(("n1", "n2"), uuids, strict=True))
        if not ran_once:
            raise DemoFailed(f"the batch's resets did not run exactly once: {counts}")
        print(f"each leaf ran exactly once: {counts}")
        lone = self.cmd("n1", "gpu.reset", json.dumps({"gpu_uuids": [uuids[0]]}))
        print(f"an unbatched gpu.reset: {lone['state']} {lone['reason']}")

        self.say("raising k is itself a quorum change: it reaches the nodes only once two approvers sign it")
        change = self.bcj("approvers", "threshold", "3")["change"]
        self.bc("approve", "show", change["id"], show=True)
        for signer in ("carol", "alice"):
            self.bc(
                "approve", "sign", change["id"], "--key", str(keys[signer]), "--yes", show=True, config=configs[signer]
            )
        k_held = self.wait("n1 to hold k = 3", lambda: self._held_k("n1") == 3 and 3)
        events = self.bcj("events", "--limit", "1000")
        return {
            "nodes": len(NODES),
            "reserve_to_observed_ms": round(took_ms),
            "events": len(events),
            "generations": {n: self.node(n)["generation"] for n, _ in NODES},
            "commands": len(self.bcj("cmd", "list", "--limit", "1000")),
            "interrupted_reset": f"{final['state']} {final['reason']}",
            "reboot": f"{reboot['state']} {reboot['reason']}",
            "forged_command": f"{refused['state']} {refused['reason']}",
            "revoked_node_out_s": round(revoked_s, 1),
            "viewer_reserve": viewer_refused.removeprefix("error: "),
            "approval_under_another_operator": stolen.removeprefix("error: "),
            "quorum_batch": f"approved by 2 of 3, each leaf ran once: {ran_once}",
            "threshold_change": f"k = {k_held} on n1 after two approvals of the current approvers",
            "unbatched_reset": f"{lone['state']} {lone['reason']}",
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
