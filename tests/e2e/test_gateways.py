"""Two `bc serve` processes on one PostgreSQL store: a node re-homes when its gateway dies mid-command.

Real processes: gateways gw-a and gw-b share a schema (and the lab's CA and keys, copied to gw-b's data
dir); n1 joined with `--server B,A`, so it dials gw-b first. The operator's CLI talks to gw-a only, so
the command reaches n1's session on gw-b through the store and a LISTEN/NOTIFY wake-up. gw-b is
killed (-9) while the command runs on the node: the node dials gw-a, reports the result there, the reset
ran once, and the node was never marked unreachable.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from bc.gateway.sessions import GATEWAY_LEASE_TTL_MS
from tests.pg import fresh_schema_sync, schema_url

from .harness import Lab, free_port
from .test_commands import assert_outcome, first_gpu, resets, start_running, wait_settled

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

LEASE_S = GATEWAY_LEASE_TTL_MS / 1000


def serve(lab: Lab, name: str, data_dir: Path, port: int, store: str, *extra: str) -> None:
    """A `bc serve` named `name` on the shared store (`--gateway-id name`)."""
    lab.serve(name, data_dir, port, store, "--gateway-id", name, *extra)


def two_gateways(lab: Lab, store: str) -> int:
    """gw-a on the lab's data dir and port, gw-b on a copy of it (the fleet's CA and keys); gw-b's port."""
    serve(lab, "gw-a", lab.server_dir, lab.port, store)
    b_dir, b_port = lab.root / "server-b", free_port()
    lab.copy_server_dir(b_dir)
    serve(lab, "gw-b", b_dir, b_port, store)
    return b_port


def test_a_node_re_homes_when_its_gateway_is_killed_mid_command_and_nothing_runs_twice(lab: Lab) -> None:
    with fresh_schema_sync() as (url, schema):
        store = schema_url(url, schema)
        b_port = two_gateways(lab, store)

        token = lab.token("n1")
        servers = f"127.0.0.1:{b_port},127.0.0.1:{lab.port}"
        lab.bc("join", "--server", servers, "--token", token, "--data-dir", str(lab.node_dir("n1")))
        lab.node("n1", env={"BC_FAKE_GPU_RESET_S": "4"})
        lab.wait_converged("n1")
        assert lab.show("n1")["gateway_id"] == "gw-b"
        gpu = first_gpu(lab)

        cmd = start_running(lab, "gpu.reset", "--payload", json.dumps({"gpu_uuids": [gpu]}))  # asked of gw-a
        lab.kill("gw-b")
        done = wait_settled(lab, cmd["id"], timeout=40)
        assert_outcome(done, "succeeded")
        assert lab.show("n1")["gateway_id"] == "gw-a"
        assert resets(lab) == {gpu: 1}
        states = [e["data"]["state"] for e in lab.events("node.connectivity") if e["subject"] == "n1"]
        assert "unreachable" not in states, states
        lab.kill("gw-a")


def test_bc_serve_drain_moves_every_node_to_the_other_gateway_and_exits(lab: Lab) -> None:
    with fresh_schema_sync() as (url, schema):
        store = schema_url(url, schema)
        b_port = two_gateways(lab, store)
        nodes = ("n1", "n2", "n3")
        for n in nodes:
            servers = f"127.0.0.1:{b_port},127.0.0.1:{lab.port}"
            lab.bc("join", "--server", servers, "--token", lab.token(n), "--data-dir", str(lab.node_dir(n)))
            lab.node(n)
        for n in nodes:
            lab.wait_converged(n)
            assert lab.show(n)["gateway_id"] == "gw-b"

        # The operator's config for gw-b: the same operator, gw-b's address.
        cfg = json.loads((lab.server_dir / "operator" / "config.json").read_text())
        b_cfg = lab.server_dir / "operator" / "config-b.json"  # beside the key and certificates it names
        b_cfg.write_text(json.dumps({**cfg, "server": f"127.0.0.1:{b_port}"}))
        doc = lab.bc("serve", "drain", "--over", "3", env={"BC_CONFIG": str(b_cfg)}, timeout=60)
        assert doc == {"gateway_id": "gw-b", "sessions": 3, "over_s": 3, "stopped": True}, doc
        assert lab.procs["gw-b"].popen.wait(timeout=20) == 0  # it exits by itself, cleanly

        for n in nodes:
            lab.wait_for(
                f"{n} on gw-a", lambda n=n: lab.show(n)["gateway_id"] == "gw-a" and lab.show(n)["state"] == "connected"
            )
        states = [e["data"]["state"] for e in lab.events("node.connectivity")]
        assert "unreachable" not in states, states
        lab.kill("gw-a")


def test_api_gateway_and_worker_in_three_processes_run_a_hold_and_a_command_together(lab: Lab) -> None:
    """`--roles`: the CLI talks to the api process, the node's session lives on the gateway process, and only
    the worker process places reservations; a hold and a command need all three, through the store.

    The worker holds the worker key alone (no CA or root key, no listener). The gateway starts from an
    empty data dir and holds no CA, root or worker key: its serving certificate is
    issued by the api through the store, it relays the trust the api published, and the node joins through
    it alone (it forwards Join to the api it finds in the store)."""
    with fresh_schema_sync() as (url, schema):
        store = schema_url(url, schema)
        serve(lab, "api", lab.server_dir, lab.port, store, "--roles", "api")
        worker_dir, gw_dir = lab.root / "server-worker", lab.root / "server-gw"
        # The worker signs with the worker key alone: the three files of pki/signing/ it needs, nothing else.
        (worker_dir / "pki" / "signing").mkdir(parents=True, mode=0o700)
        for name in ("worker.key", "worker.crt", "root.crt"):
            shutil.copy2(lab.server_dir / "pki" / "signing" / name, worker_dir / "pki" / "signing" / name)
        gw_port = free_port()
        serve(lab, "gw", gw_dir, gw_port, store, "--roles", "gateway")
        lab.spawn(
            "worker", "serve", "--store", store, "--gateway-id", "worker", "--roles", "worker",
            "--data-dir", str(worker_dir), env={"BC_DATA_DIR": str(worker_dir)},
        )  # fmt: skip
        lab.wait_for("the worker to start", lambda: "bc serve running the worker role" in lab.log("worker"))
        held = sorted(str(p.relative_to(gw_dir)) for p in gw_dir.rglob("*.key"))
        assert held == ["gateway/serving.key"], held
        held = sorted(str(p.relative_to(worker_dir)) for p in worker_dir.rglob("*.key"))
        assert held == ["pki/signing/worker.key"], held
        assert not (gw_dir / "pki").exists() and not (gw_dir / "operator").exists()
        assert "waiting for an api process" in lab.log("gw") or "serving-cert.issued" in lab.log("gw")

        # Join is the api's, forwarded by the gateway; the session is the gateway's.
        servers = f"127.0.0.1:{gw_port}"
        lab.bc("join", "--server", servers, "--token", lab.token("n1"), "--data-dir", str(lab.node_dir("n1")))
        assert "event=join-proxy.forwarded" in lab.log("gw")
        lab.node("n1")
        lab.wait_converged("n1", timeout=40)
        assert lab.show("n1")["gateway_id"] == "gw"

        hold = lab.bc("reserve", "--gpus", "1", "--node", "n1")
        lab.wait_reservation_state(hold["id"], "active", timeout=30)  # placed by the worker, bound via gw
        assert lab.cdi_path("n1", hold["allocation_id"]).exists()
        done = lab.bc("cmd", "run", "n1", "inventory.refresh", "--wait", timeout=60)
        assert done["state"] == "succeeded", done
        placed = [e for e in lab.events("reservation.placed") if e["subject"] == hold["id"]]
        assert placed, "the worker process placed nothing"
        assert "event=session.opened" not in lab.log("api")
        assert "event=session.opened" in lab.log("gw")
        assert not lab.events("security.spec-rejected") and not lab.events("security.report-rejected")
        for name in ("worker", "gw", "api"):
            lab.kill(name)


def test_a_gateway_worker_process_holds_no_ca_or_root_key_and_a_node_joins_holds_and_runs_through_it(
    lab: Lab,
) -> None:
    """Keys follow roles: `--roles gateway,worker` beside `--roles api` reads the worker key (the three files of
    pki/signing/ copied from the api) and its own serving key, and no CA or root key. The node joins through it
    (Join forwarded to the api), its session is there, its placement pass places a hold the node accepts, and
    a command asked of the api runs."""
    with fresh_schema_sync() as (url, schema):
        store = schema_url(url, schema)
        serve(lab, "api", lab.server_dir, lab.port, store, "--roles", "api")
        gw_dir, gw_port = lab.root / "server-gw", free_port()
        (gw_dir / "pki" / "signing").mkdir(parents=True, mode=0o700)
        for name in ("worker.key", "worker.crt", "root.crt"):
            shutil.copy2(lab.server_dir / "pki" / "signing" / name, gw_dir / "pki" / "signing" / name)
        serve(lab, "gw", gw_dir, gw_port, store, "--roles", "gateway,worker")
        lab.wait_for("the gateway+worker to say what it holds", lambda: "no CA or root key" in lab.log("gw"))
        held = sorted(str(p.relative_to(gw_dir)) for p in gw_dir.rglob("*.key"))
        assert held == ["gateway/serving.key", "pki/signing/worker.key"], held
        assert not (gw_dir / "operator").exists()

        lab.bc(
            "join",
            "--server",
            f"127.0.0.1:{gw_port}",
            "--token",
            lab.token("n1"),
            "--data-dir",
            str(lab.node_dir("n1")),
        )
        assert "event=join-proxy.forwarded" in lab.log("gw")
        lab.node("n1")
        lab.wait_converged("n1", timeout=40)
        assert lab.show("n1")["gateway_id"] == "gw"
        hold = lab.bc("reserve", "--gpus", "1", "--node", "n1")
        lab.wait_reservation_state(hold["id"], "active", timeout=30)  # placed by gw's worker loops
        assert lab.cdi_path("n1", hold["allocation_id"]).exists()
        done = lab.bc("cmd", "run", "n1", "inventory.refresh", "--wait", timeout=60)
        assert done["state"] == "succeeded", done
        assert not lab.events("security.spec-rejected") and not lab.events("security.report-rejected")
        for name in ("gw", "api"):
            lab.kill(name)


def test_a_gateway_paused_past_its_lease_is_fenced_when_it_wakes_and_routes_nothing(lab: Lab) -> None:
    """SIGSTOP the node's gateway for longer than its 20 s lease: the node moves to the other gateway; on
    SIGCONT the paused one fences itself (it woke late), its stale session closes, and its writes, fenced by
    the session epoch, change nothing: the node stays routed to the live gateway and a command runs once."""
    with fresh_schema_sync() as (url, schema):
        store = schema_url(url, schema)
        b_port = two_gateways(lab, store)
        servers = f"127.0.0.1:{b_port},127.0.0.1:{lab.port}"
        lab.bc("join", "--server", servers, "--token", lab.token("n1"), "--data-dir", str(lab.node_dir("n1")))
        lab.node("n1")
        lab.wait_converged("n1")
        assert lab.show("n1")["gateway_id"] == "gw-b"

        paused = lab.procs["gw-b"].popen.pid
        os.killpg(paused, signal.SIGSTOP)
        try:
            lab.wait_for("n1 on gw-a", lambda: lab.show("n1")["gateway_id"] == "gw-a", timeout=30)
            time.sleep(LEASE_S + 1)  # the fault itself: gw-b stays paused past its lease
        finally:
            os.killpg(paused, signal.SIGCONT)
        lab.wait_for("gw-b to fence itself", lambda: "event=gateway.fenced" in lab.log("gw-b"), timeout=20)
        epoch = lab.show("n1")["session_epoch"]
        done = lab.bc("cmd", "run", "n1", "inventory.refresh", "--wait", timeout=60)
        assert done["state"] == "succeeded", done
        shown = lab.show("n1")
        assert shown["gateway_id"] == "gw-a" and shown["session_epoch"] == epoch and shown["state"] == "connected"
        states = [e["data"]["state"] for e in lab.events("node.connectivity") if e["subject"] == "n1"]
        assert "unreachable" not in states, states
        for name in ("gw-b", "gw-a"):
            lab.kill(name)
