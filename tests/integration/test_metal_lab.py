"""Provisioning a bare machine end to end in the in-process lab (docs/metal.md, "Provisioning as jobs").

Real `bc serve` (gRPC, mutual TLS, the job queue, SQLite and PostgreSQL), a real site agent driving
sushy-tools' Redfish emulator (tests/redfish_bmc.py) with its image cache and the boot server's HTTP half
(its DHCP half, dnsmasq, is not started: it would answer on a real interface), a real ramdisk agent on a disk
image file (`--machine-root` tree), and the fake kexec edge. The test plays only what the hardware does:
the machine's firmware fetches its iPXE script from the site (which carries the ramdisk's join token the job
minted) and boots the ramdisk (the test joins and starts it); after the kexec the installed OS boots (the test
reads the kexec plan's command line, which carries the OS's token, and joins and starts a node agent with it).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent.app import Agent, AgentOptions
from agent.join import join_node
from agent.ramdisk.kexec import KEXEC_FILE
from agent.site.state import SiteOptions
from bc.client.admin import AdminClient
from bc.errors import Conflict, Unauthenticated
from bc.pki.batch_scope import recompute_root
from bc.protocol.pb import admin_pb2, metal_pb2
from tests.integration.conftest import InprocLab
from tests.integration.operators_lab import add_operator, approvers, sign
from tests.ramdisk_disks import add_sys_disk
from tests.redfish_bmc import SYSTEM_MAC, RedfishBmcUnderTest, redfish_bmc

MIB = 1 << 20
KERNEL = b"a ramdisk kernel " * 512
INITRD = b"a ramdisk initramfs " * 512

needs_tools = pytest.mark.skipif(
    not (shutil.which("sfdisk") and shutil.which("mkfs.ext4") and shutil.which("blkid")),
    reason="needs util-linux's sfdisk and blkid and e2fsprogs' mkfs.ext4 (.ci/run installs fdisk)",
)


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def bmc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedfishBmcUnderTest]:
    with redfish_bmc(tmp_path_factory.mktemp("bmc")) as b:
        yield b


def build_os_image(tmp: Path) -> bytes:
    """A 16 MiB GPT image with an ext4 partition, by the real sfdisk and mkfs.ext4 (what deploy.image checks)."""
    path = tmp / "os.raw"
    with path.open("wb") as f:
        f.truncate(16 * MIB)
    subprocess.run(["sfdisk", "-q", str(path)], input=b"label: gpt\n2048,24576,L\n", check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-L", "os", "-E", f"offset={2048 * 512}", str(path), "12M"], check=True)
    return path.read_bytes()


@pytest.fixture
def images(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, tuple[str, bytes]]]:
    """The ramdisk kernel, initrd and the OS image on an HTTP server apart from the BMC's host (the site pulls)."""
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    files = {"vmlinuz": KERNEL, "initrd.img": INITRD, "os.raw": build_os_image(tmp_path)}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = files.get(self.path.rsplit("/", 1)[-1])
            if body is None:
                self.send_response(404)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.2", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    base = f"http://127.0.0.2:{server.server_address[1]}"
    try:
        yield {name: (f"{base}/{name}", body) for name, body in files.items()}
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


async def start_agent(lab: InprocLab, node_id: str, **kw: Any) -> Agent:
    agent = Agent(AgentOptions(data_dir=lab.node_dir(node_id), fake_hw="hgx-h100-8", heartbeat_interval_s=1.0, **kw))
    lab.agents[node_id] = agent
    lab.tasks[node_id] = asyncio.create_task(agent.run(), name=f"agent-{node_id}")
    return agent


async def start_site(lab: InprocLab, bmc: RedfishBmcUnderTest, tmp: Path, images: dict[str, Any]) -> str:
    """A site agent with its section converged (credentials, cached images, boot server); its HTTP address."""
    creds = tmp / "bmc.json"
    creds.write_text(json.dumps({"default": {"username": "admin", "password": "pw"}}))
    creds.chmod(0o600)
    bmc.state.accounts["admin"] = "pw"
    tok = await lab.admin.create_token("s1", role="site")
    await join_node(lab.server.address, tok.token, lab.node_dir("s1"))
    await start_agent(lab, "s1", site=SiteOptions(run_dnsmasq=False))
    await lab.wait_observed("s1", 1)
    http = f"127.0.0.1:{free_port()}"
    section = {
        "credentialsFile": str(creds),
        "cacheImages": [{"url": url, "sha256": sha(body)} for url, body in images.values()],
        "boot": {"interface": "lo", "dhcpRange": "127.0.0.10,127.0.0.20", "httpAddress": http},
    }
    gen = (await lab.admin.set_spec_section("s1", "site", json.dumps(section))).generation
    await lab.wait_observed("s1", gen, timeout=60)
    return http


async def machine_state(lab: InprocLab, name: str) -> str:
    m = await lab.admin.get_machine(name)
    return f"{m.state}:{m.step}" if m.step else m.state


async def test_machines_are_enrolled_listed_and_removed_through_the_admin_api_by_an_admin_only(
    lab: InprocLab, bmc: RedfishBmcUnderTest
) -> None:
    tok = await lab.admin.create_token("s1", role="site")
    await join_node(lab.server.address, tok.token, lab.node_dir("s1"))
    req = metal_pb2.EnrollMachineRequest(
        name="m1", site_node="s1", bmc_url=bmc.url, macs=[SYSTEM_MAC.upper()], labels=["pool=gpu"]
    )
    async with AdminClient(await add_operator(lab, "olga", "operator")) as olga:
        with pytest.raises(Unauthenticated, match="enrolling a machine needs the admin role"):
            await olga.enroll_machine(req)
        resp = await lab.admin.enroll_machine(req)
        assert (resp.machine.name, resp.machine.state, resp.pending_batch_id) == ("m1", "enrolled", "")
        assert list(resp.machine.macs) == [SYSTEM_MAC] and dict(resp.machine.labels) == {"pool": "gpu"}
        [listed] = (await olga.list_machines()).machines  # a viewer's read
        assert (listed.name, listed.site_node, listed.bmc_url) == ("m1", "s1", bmc.url)
        with pytest.raises(Unauthenticated, match="provisioning machines needs the admin role"):
            await olga.provision_machines(metal_pb2.ProvisionMachinesRequest(machines=["m1"], image="x"))
    spec = json.loads((await lab.admin.get_spec("s1")).spec_json)
    assert spec["site"]["machines"] == [{"name": "m1", "bmc_url": bmc.url, "macs": [SYSTEM_MAC]}]
    with pytest.raises(Conflict, match="already"):
        await lab.admin.enroll_machine(req)
    await lab.admin.remove_machine("m1")
    assert not (await lab.admin.list_machines()).machines
    assert "machines" not in json.loads((await lab.admin.get_spec("s1")).spec_json).get("site", {})


async def boot_the_machine(lab: InprocLab, http: str, job: admin_pb2.JobInfo, tmp_path: Path, os_image: bytes) -> None:
    """What the hardware does: PXE into the ramdisk with the token the site's script carries, then (after the
    kexec) the installed OS with the token its command line carries; until the job ends done."""
    await lab.wait_event("metal.step", lambda ev, d: ev.subject == "m1" and d["step"] == "ramdisk", 60)
    async with httpx.AsyncClient(base_url=f"http://{http}", trust_env=False) as site:
        script = (await site.get(f"/boot/{SYSTEM_MAC}.ipxe")).text
        token = re.search(r"bc\.join_token=(\S+)", script)
        assert token is not None, script
        tree = tmp_path / "machine"
        disk = add_sys_disk(tree, "vda", 32 * MIB)
        await join_node(lab.server.address, token.group(1), lab.node_dir("m1-ramdisk"))
        await start_agent(lab, "m1-ramdisk", machine_root=tree)

        # The ramdisk wipes, deploys and kexecs; the installed OS boots with the token on its command line.
        async with asyncio.timeout(120):
            while not (lab.node_dir("m1-ramdisk") / KEXEC_FILE).exists():
                await asyncio.sleep(0.1)
        plan = json.loads((lab.node_dir("m1-ramdisk") / KEXEC_FILE).read_text())
        os_token = re.search(r"bc\.join_token=(\S+)", plan["cmdline"])
        assert os_token is not None and plan["kernel"] == "/boot/vmlinuz", plan
        assert disk.read_bytes()[: 16 * MIB] == os_image
        await join_node(lab.server.address, os_token.group(1), lab.node_dir("m1"))
        await start_agent(lab, "m1")

        done = await lab.wait_event("job.settled", lambda ev, d: ev.subject == job.id, 120)
        assert json.loads(done.data_json)["state"] == "done", await lab.admin.get_job(job.id)
        assert (await site.get(f"/boot/{SYSTEM_MAC}.ipxe")).status_code == 404  # the lease is cleaned up


def provision_request(**kw: Any) -> metal_pb2.ProvisionMachinesRequest:
    return metal_pb2.ProvisionMachinesRequest(
        machines=["m1"],
        image="os.raw",
        ramdisk_kernel_sha256=sha(KERNEL),
        ramdisk_initrd_sha256=sha(INITRD),
        join_timeout_s=120,
        **kw,
    )


@needs_tools
async def test_a_machine_is_provisioned_from_enroll_to_a_joined_node(
    lab: InprocLab, bmc: RedfishBmcUnderTest, images: dict[str, tuple[str, bytes]], tmp_path: Path
) -> None:
    http = await start_site(lab, bmc, tmp_path, images)
    await lab.admin.enroll_machine(
        metal_pb2.EnrollMachineRequest(name="m1", site_node="s1", bmc_url=bmc.url, macs=[SYSTEM_MAC], labels=["a=b"])
    )
    job = await lab.admin.provision_machines(provision_request(labels=["pool=gpu"]))
    assert job.template == "metal.provision"
    await boot_the_machine(lab, http, job, tmp_path, images["os.raw"][1])
    m = await lab.admin.get_machine("m1")
    assert (m.state, m.node_id, m.dag_id) == ("provisioned", "m1", job.id), m
    node = await lab.admin.get_node("m1")
    mine = {k: v for k, v in node.labels.items() if not k.startswith("bc.dev/")}  # without the agent's own
    assert (node.role, mine) == ("node", {"a": "b", "pool": "gpu"})
    # What the site did to the BMC, step by step: the job's commands, each sent once.
    steps = {n.id: json.loads(n.detail_json) for n in (await lab.admin.get_job(job.id)).nodes}
    results = {}
    for step in ("power-off:m1", "pxe:m1", "power-on:m1"):
        cmd = await lab.admin.get_command(steps[step]["command_id"])
        assert cmd.state == "succeeded", (step, cmd)
        results[step] = json.loads(cmd.result_json)
    assert (results["power-off:m1"]["reset_type"], results["power-on:m1"]["reset_type"]) == ("ForceOff", "On")
    keys = [c.idempotency_key for c in await lab.admin.list_commands() if c.idempotency_key.startswith("job:")]
    assert len(keys) == len(set(keys)) == 8, keys


@needs_tools
async def test_under_the_quorum_the_agents_run_each_destructive_step_as_a_leaf_of_one_signed_metal_bulk_batch(
    lab: InprocLab, bmc: RedfishBmcUnderTest, images: dict[str, tuple[str, bytes]], tmp_path: Path
) -> None:
    http = await start_site(lab, bmc, tmp_path, images)
    await lab.admin.enroll_machine(
        metal_pb2.EnrollMachineRequest(name="m1", site_node="s1", bmc_url=bmc.url, macs=[SYSTEM_MAC])
    )
    signers = await approvers(lab)  # after the site's section: its root-equivalent fields are set already
    site = lab.agents["s1"]
    async with asyncio.timeout(10):  # the new bundle (approvers, k) reaches the site's live session
        while len(site.trust.bundle.approver_keys) != 3:
            await asyncio.sleep(0.05)
    job = await lab.admin.provision_machines(provision_request(disk="vda"))
    await lab.wait_event("batch.created", lambda ev, d: d.get("dag_id") == job.id, 30)
    [bulk] = [n for n in (await lab.admin.get_job(job.id)).nodes if n.id == "bulk"]
    batch = await lab.admin.get_batch(json.loads(bulk.detail_json)["batch_id"])
    assert batch.kind == "metal.bulk" and len(batch.leaves) == 5
    assert recompute_root(batch).hex() == batch.scope_root  # what `bc approve sign` checks before it signs
    assert not [c for c in await lab.admin.list_commands() if c.node_id == "s1" and c.kind == "bmc.power"]
    for a in signers[:2]:
        await sign(lab, batch, a)
    await boot_the_machine(lab, http, job, tmp_path, images["os.raw"][1])
    assert (await lab.admin.get_machine("m1")).state == "provisioned"
    leaves = {leaf.kind: leaf.command_state for leaf in (await lab.admin.get_batch(batch.id)).leaves}
    assert set(leaves.values()) == {"succeeded"}, leaves  # each ran on its node with its proof, once
    assert (await lab.admin.get_batch(batch.id)).resolution == "done"


@needs_tools
async def test_a_bmc_that_stops_answering_fails_its_machine_at_that_step(
    lab: InprocLab, bmc: RedfishBmcUnderTest, images: dict[str, tuple[str, bytes]], tmp_path: Path
) -> None:
    await start_site(lab, bmc, tmp_path, images)
    dead = f"http://127.0.0.1:{free_port()}"  # nobody listens: bmc-unreachable
    for name, url, mac in (("m1", bmc.url, SYSTEM_MAC), ("m2", dead, "52:54:00:00:00:02")):
        await lab.admin.enroll_machine(
            metal_pb2.EnrollMachineRequest(name=name, site_node="s1", bmc_url=url, macs=[mac])
        )
    job = await lab.admin.provision_machines(
        metal_pb2.ProvisionMachinesRequest(
            machines=["m1", "m2"],
            image="os.raw",
            ramdisk_kernel_sha256=sha(KERNEL),
            ramdisk_initrd_sha256=sha(INITRD),
            join_timeout_s=60,
        )
    )
    await lab.wait_event("metal.outcome", lambda ev, d: ev.subject == "m2", 60)
    m2 = await lab.admin.get_machine("m2")
    assert (m2.state, m2.step) == ("failed", "power-off"), m2
    assert "bmc-unreachable" in m2.reason
    # m1 went on past the power steps: its ramdisk is awaited (no ramdisk boots here; the job is cancelled)
    await lab.wait_event("metal.step", lambda ev, d: ev.subject == "m1" and d["step"] == "ramdisk", 60)
    await lab.admin.cancel_job(job.id)
    await lab.wait_event("metal.outcome", lambda ev, d: ev.subject == "m1", 30)
    assert await machine_state(lab, "m1") == "failed:ramdisk"
