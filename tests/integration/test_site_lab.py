"""A site agent in the in-process lab: joined with a `--role site` token, driven through a real `bc serve`.

Real gRPC, mutual TLS, the store (SQLite and PostgreSQL), the journal, and a real Redfish BMC (sushy-tools'
emulator behind its HTTP edge, tests/redfish_bmc.py). The operator sets the `site` section and sees it
converge once its image is cached; `bmc.query` settles with the machine's power state, `bmc.power` (a
destructive kind) with its reset, `bmc.rotate` settles attested (signed by the site's node key); the
server refuses a site kind for a node of role node, and a site section that breaks the rules; once
approvers exist, `bmc.power` and `site.httpProxy` run only as approved batch leaves.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from agent.app import Agent, AgentOptions
from agent.join import join_node
from agent.site.state import SiteOptions
from bc.errors import UsageError
from bc.protocol.pb import admin_pb2, common_pb2
from tests.integration.conftest import InprocLab
from tests.integration.operators_lab import approvers, sign
from tests.redfish_bmc import SYSTEM_MAC, RedfishBmcUnderTest, redfish_bmc

IMAGE = b"a ramdisk kernel " * 512


@pytest.fixture(scope="module")
def bmc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedfishBmcUnderTest]:
    with redfish_bmc(tmp_path_factory.mktemp("bmc")) as b:
        yield b


@pytest.fixture
def image_url(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(IMAGE)))
            self.end_headers()
            self.wfile.write(IMAGE)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    # On 127.0.0.2: the BMC is on 127.0.0.1, and a site never pulls an image from a BMC's host.
    server = ThreadingHTTPServer(("127.0.0.2", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.2:{server.server_address[1]}/vmlinuz"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


async def settled(lab: InprocLab, command_id: str, timeout: float = 30.0) -> admin_pb2.CommandInfo:
    await lab.wait_event("command.settled", lambda ev, d: ev.subject == command_id, timeout)
    return await lab.admin.get_command(command_id)


async def start_site(lab: InprocLab, node_id: str) -> Agent:
    tok = await lab.admin.create_token(node_id, role="site")
    await join_node(lab.server.address, tok.token, lab.node_dir(node_id))
    opts = AgentOptions(
        data_dir=lab.node_dir(node_id),
        fake_hw="hgx-h100-8",
        heartbeat_interval_s=1.0,
        site=SiteOptions(run_dnsmasq=False),
    )
    agent = Agent(opts)
    lab.agents[node_id] = agent
    lab.tasks[node_id] = asyncio.create_task(agent.run(), name=f"agent-{node_id}")
    return agent


async def test_a_site_agent_runs_the_site_kinds_through_the_control_plane(
    lab: InprocLab, bmc: RedfishBmcUnderTest, image_url: str, tmp_path: Path
) -> None:
    bmc.state.accounts["admin"] = "old-password"
    creds = tmp_path / "bmc.json"
    creds.write_text(json.dumps({"default": {"username": "admin", "password": "old-password"}}))
    creds.chmod(0o600)
    await start_site(lab, "s1")
    await lab.wait_observed("s1", 1)
    section = {
        "machines": [{"name": "m1", "bmcUrl": bmc.url, "macs": [SYSTEM_MAC]}],
        "credentialsFile": str(creds),
        "cacheImages": [{"url": image_url, "sha256": hashlib.sha256(IMAGE).hexdigest()}],
    }
    gen = (await lab.admin.set_spec_section("s1", "site", json.dumps(section))).generation
    await lab.wait_observed("s1", gen, timeout=30)
    node = await lab.admin.get_node("s1")
    [site_status] = [s for s in node.sections if s.section == "site"]
    assert site_status.state == common_pb2.CONVERGED, site_status
    assert "1 images cached" in site_status.message

    query = await lab.admin.run_command("s1", "bmc.query", payload_json='{"machine": "m1"}')
    done = await settled(lab, query.id)
    assert done.state == "succeeded", done
    result = json.loads(done.result_json)
    assert result["machine"] == "m1" and SYSTEM_MAC in result["inventory"]["nics"]

    power = await lab.admin.run_command("s1", "bmc.power", payload_json='{"machine": "m1", "action": "on"}')
    done = await settled(lab, power.id)
    assert (done.state, json.loads(done.result_json)["reset_type"]) == ("succeeded", "On"), done

    rotate = await lab.admin.run_command("s1", "bmc.rotate", payload_json='{"machine": "m1"}')
    done = await settled(lab, rotate.id)
    assert done.state == "succeeded", done
    assert done.attested  # settled only with the site's own signature over the result
    assert bmc.state.accounts["admin"] == json.loads(creds.read_text())["machines"]["m1"]["password"]

    bad = await lab.admin.run_command("s1", "bmc.power", payload_json='{"machine": "m1", "action": "explode"}')
    done = await settled(lab, bad.id)
    assert (done.state, done.reason) == ("failed", "invalid-payload")


async def test_site_kinds_go_to_site_nodes_only_and_a_bad_section_is_refused(lab: InprocLab) -> None:
    await lab.join("n1")
    await lab.start_node("n1")
    await lab.wait_observed("n1", 1)
    with pytest.raises(UsageError, match=r"kind bmc.query does not run on node n1 \(role node\); it runs on site"):
        await lab.admin.run_command("n1", "bmc.query", payload_json='{"machine": "m1"}')
    bad = {"machines": [{"name": "m1", "bmcUrl": "https://admin:pw@10.9.0.1"}]}
    with pytest.raises(UsageError, match="must not carry credentials"):
        await lab.admin.set_spec_section("n1", "site", json.dumps(bad))


async def test_once_approvers_exist_a_bmc_kind_runs_only_as_an_approved_batch_leaf(
    lab: InprocLab, bmc: RedfishBmcUnderTest, tmp_path: Path
) -> None:
    bmc.state.accounts["admin"] = "old-password"
    creds = tmp_path / "bmc.json"
    creds.write_text(json.dumps({"default": {"username": "admin", "password": "old-password"}}))
    creds.chmod(0o600)
    agent = await start_site(lab, "s1")
    await lab.wait_observed("s1", 1)
    section = {"machines": [{"name": "m1", "bmcUrl": bmc.url}], "credentialsFile": str(creds)}
    gen = (await lab.admin.set_spec_section("s1", "site", json.dumps(section))).generation
    await lab.wait_observed("s1", gen, timeout=30)
    keys = await approvers(lab)
    async with asyncio.timeout(10):
        while len(agent.trust.bundle.approver_keys) != 3:  # the new bundle reaches the live session
            await asyncio.sleep(0.05)

    for kind, payload in (
        ("bmc.power", '{"machine": "m1", "action": "off"}'),
        ("site.httpProxy", '{"target_node_id": "gpu-07", "url": "http://10.1.0.7/metrics"}'),
    ):
        lone = await lab.admin.run_command("s1", kind, payload_json=payload)
        done = await settled(lab, lone.id)
        assert (done.state, done.reason) == ("rejected", "UNBATCHED_LIMIT"), (kind, done)

    b = await lab.admin.create_batch("bmc.power", ["s1"], '{"machine": "m1", "action": "off"}', reason="rack move")
    b = await sign(lab, b, keys[0])
    b = await sign(lab, b, keys[1])
    assert b.state == "approved"
    done = await settled(lab, b.leaves[0].command_id)
    assert (done.state, json.loads(done.result_json)["reset_type"]) == ("succeeded", "ForceOff"), done
