"""Three gateways, fifty agents: one gateway killed (-9) in the middle of a fleet-wide `gpu.reset`.

Real processes: `bc serve --gateway-id gw-a|gw-b|gw-c` on one PostgreSQL schema (gw-b and gw-c on copies of
gw-a's data dir: the fleet's CA and keys). The fifty agents are the real agent code (joins, sessions over
gRPC and mutual TLS, journals, fake GPUs) but share ONE helper process (`tests.e2e.fleet_agents`), since a
2-core machine cannot run fifty `bc node` processes beside three servers. Each node joined with all three
addresses, its own first (node i starts at gateway i mod 3), so the fleet is spread over the gateways.

One `gpu.reset` goes to every node (each takes 6 s on the fake hardware), asked of gw-a only: gw-b and gw-c
learn of theirs through the store (LISTEN/NOTIFY pokes, then their dispatch pass). Once gw-b's nodes run
theirs, gw-b is killed. Every node re-homes to gw-a or gw-c; every reset settles `succeeded` once (one
`command.settled` event each), ran once on the fake hardware (the per-GPU reset counts the agents keep),
and no node was ever marked `unreachable`.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Awaitable, Callable

import pytest

from bc.client.admin import AdminClient
from bc.runtime.config import OperatorConfig
from tests.pg import fresh_schema_sync, schema_url

from .harness import Lab, free_port
from .test_commands import resets

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

NODES = 50
GATEWAYS = ("gw-a", "gw-b", "gw-c")
RESET_S = 6
TERMINAL = frozenset({"succeeded", "failed", "rejected", "cancelled", "expired", "timed_out"})


def three_gateways(lab: Lab, store: str) -> list[str]:
    """gw-a on the lab's data dir and port, gw-b and gw-c on copies; their addresses, in that order."""
    lab.serve("gw-a", lab.server_dir, lab.port, store, "--gateway-id", "gw-a")
    addrs = [lab.address]
    for name in GATEWAYS[1:]:
        d, port = lab.root / f"server-{name}", free_port()
        lab.copy_server_dir(d)
        lab.serve(name, d, port, store, "--gateway-id", name)
        addrs.append(f"127.0.0.1:{port}")
    return addrs


async def _until(description: str, check: Callable[[], Awaitable[bool]], timeout: float, every: float = 0.25) -> None:
    """Poll the async predicate `check` until it is true (a wait on observable state, bounded)."""
    try:
        async with asyncio.timeout(timeout):
            while not await check():
                await asyncio.sleep(every)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {description}") from None


async def fleet_reset_with_a_gateway_killed(lab: Lab, addrs: list[str]) -> dict[str, object]:
    cfg = OperatorConfig.load(lab.server_dir / "operator" / "config.json")
    nodes = [f"f{i:02d}" for i in range(NODES)]
    async with AdminClient(cfg, timeout_s=30) as admin:
        tokens = await asyncio.gather(*(admin.create_token(n) for n in nodes))
        plan = {
            "heartbeat_s": 1.0,
            "nodes": [
                {
                    "node_id": n,
                    "data_dir": str(lab.node_dir(n)),
                    "servers": ",".join(addrs[(i + k) % len(addrs)] for k in range(len(addrs))),
                    "token": tok.token,
                }
                for i, (n, tok) in enumerate(zip(nodes, tokens, strict=True))
            ],
        }
        plan_path = lab.root / "fleet.json"
        plan_path.write_text(json.dumps(plan))
        lab.spawn_module("agents", "tests.e2e.fleet_agents", str(plan_path), env={"BC_FAKE_GPU_RESET_S": str(RESET_S)})

        gpus: dict[str, str] = {}

        async def all_connected_with_inventory() -> bool:
            if sum(1 for n in await admin.list_nodes() if n.state == "connected") < NODES:
                return False
            for n in nodes:  # the inventory follows the Hello
                if n not in gpus:
                    inv = (await admin.get_node(n)).inventory
                    if inv.gpus:
                        gpus[n] = inv.gpus[0].uuid
            return len(gpus) == NODES

        await _until(f"{NODES} nodes connected", all_connected_with_inventory, timeout=40)
        listed = {n.node_id: n for n in await admin.list_nodes()}
        homes = {n: listed[n].gateway_id for n in nodes}
        assert set(homes.values()) == set(GATEWAYS), Counter(homes.values())

        # The fleet-wide command: one reset per node, all asked of gw-a.
        cmds = await asyncio.gather(
            *(admin.run_command(n, "gpu.reset", payload_json=json.dumps({"gpu_uuids": [gpus[n]]})) for n in nodes)
        )
        ids = {c.node_id: c.id for c in cmds}
        on_b = [n for n in nodes if homes[n] == "gw-b"]

        async def b_running() -> bool:
            states = [(await admin.get_command(ids[n])).state for n in on_b]
            return all(s == "running" for s in states)

        await _until("gw-b's nodes to run their resets", b_running, timeout=RESET_S * 2)
        lab.kill("gw-b")  # -9, mid-command

        async def all_settled() -> bool:
            return all(c.state in TERMINAL for c in await admin.list_commands(limit=NODES * 2))

        await _until("every reset to settle", all_settled, timeout=40)
        done = {c.id: c for c in await admin.list_commands(limit=NODES * 2)}
        after = {n.node_id: n for n in await admin.list_nodes()}
    return {"nodes": nodes, "homes": homes, "gpus": gpus, "ids": ids, "done": done, "after": after, "on_b": on_b}


def test_fifty_agents_on_three_gateways_re_home_when_one_is_killed_mid_fleet_command_and_nothing_runs_twice(
    lab: Lab,
) -> None:
    with fresh_schema_sync() as (url, schema):
        addrs = three_gateways(lab, schema_url(url, schema))
        r = asyncio.run(fleet_reset_with_a_gateway_killed(lab, addrs))
        nodes, ids, done, after = r["nodes"], r["ids"], r["done"], r["after"]
        assert isinstance(nodes, list) and isinstance(ids, dict) and isinstance(done, dict)
        assert isinstance(after, dict) and isinstance(r["gpus"], dict) and isinstance(r["on_b"], list)
        assert r["on_b"], "no node started on gw-b: the kill tested nothing"

        brief = {n: (done[ids[n]].state, done[ids[n]].reason) for n in nodes if done[ids[n]].state != "succeeded"}
        assert brief == {}, brief
        for n in nodes:  # every node re-homed to a live gateway, connected
            assert after[n].state == "connected" and after[n].gateway_id in ("gw-a", "gw-c"), (n, after[n])
            assert resets(lab, n) == {r["gpus"][n]: 1}, (n, resets(lab, n))  # the reset ran once
        settled = Counter(e["subject"] for e in lab.events("command.settled"))
        assert {ids[n]: settled[ids[n]] for n in nodes} == {ids[n]: 1 for n in nodes}  # settled exactly once
        states = [e["data"]["state"] for e in lab.events("node.connectivity")]
        assert "unreachable" not in states, Counter(states)
        for name in ("gw-c", "gw-a"):
            lab.kill(name)
