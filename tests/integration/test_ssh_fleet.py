"""`bc ssh` end to end: a real `bc serve`, real agents, and each node's files judged by OpenSSH's own tools.

Two agents (fake GPUs, everything else real) each write their access section under their own SSH
directory, checked by `sshd -t -f` against a per-node `sshd_config` that includes the drop-in. A grant
reaches only its node's principals; a revocation reaches every node's KRL (`ssh-keygen -Q -l -f`)
within one converge pass, waited for on the node's `node.observed` event, never on a clock.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent.app import Agent, AgentOptions
from agent.converge.sshd import find_tool
from bc.pki import ssh as ssh_pki
from bc.pki.secrets_source import SystemSecrets, ed25519_key
from bc.protocol.pb import admin_pb2, common_pb2
from tests.integration.conftest import InprocLab, open_lab

NODES = ("n1", "n2")


def sshd_config(node_dir: Path) -> Path:
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd -t insists on its privilege separation directory
    node_dir.mkdir(parents=True, exist_ok=True)
    host_key = node_dir / "host_key"
    subprocess.run([find_tool("ssh-keygen"), "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
    config = node_dir / "sshd_config"
    config.write_text(f"HostKey {host_key}\nInclude {node_dir / 'ssh' / 'sshd.conf'}\n")
    return config


@pytest.fixture
async def lab(tmp_path: Path) -> AsyncIterator[InprocLab]:
    async with open_lab(tmp_path) as lab:
        for n in NODES:
            await lab.join(n)
            d = lab.node_dir(n)
            opts = AgentOptions(
                data_dir=d,
                fake_hw="hgx-h100-8",
                heartbeat_interval_s=1.0,
                sshd_config=sshd_config(d),
                ssh_dir=d / "ssh",
            )
            agent = Agent(opts)
            lab.agents[n] = agent
            lab.tasks[n] = asyncio.create_task(agent.run(), name=f"agent-{n}")
        yield lab


async def converged(lab: InprocLab) -> None:
    """Every node observed its current spec generation."""
    for n in NODES:
        spec = await lab.admin.get_spec(n)
        await lab.wait_observed(n, spec.generation)


def krl_serials(lab: InprocLab, node_id: str) -> list[int]:
    krl = lab.node_dir(node_id) / "ssh" / "revoked.krl"
    out = subprocess.run([find_tool("ssh-keygen"), "-Q", "-l", "-f", str(krl)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return [int(line.split(":")[1]) for line in out.stdout.splitlines() if line.startswith("serial:")]


def sshd_accepts(lab: InprocLab, node_id: str) -> bool:
    config = lab.node_dir(node_id) / "sshd_config"
    return subprocess.run([find_tool("sshd"), "-t", "-f", str(config)]).returncode == 0


async def test_a_grant_reaches_its_node_and_a_revocation_every_nodes_krl(lab: InprocLab, tmp_path: Path) -> None:
    ca = await lab.admin.ssh_ca_init()
    await converged(lab)
    for n in NODES:
        ssh = lab.node_dir(n) / "ssh"
        assert ca.public_key in (ssh / "ca.pub").read_text() and sshd_accepts(lab, n)
        assert krl_serials(lab, n) == []

    user = ssh_pki.public_line(ed25519_key(SystemSecrets()))
    g = await lab.admin.ssh_grant(
        admin_pb2.SshGrantRequest(node_id="n1", principal="oncall", public_key=user, ttl_s=600, reason="test")
    )
    assert g.state == "issued"
    await converged(lab)
    assert (lab.node_dir("n1") / "ssh" / "principals" / "oncall").read_text().splitlines()[1:] == ["oncall@n1"]
    assert not (lab.node_dir("n2") / "ssh" / "principals" / "oncall").exists()

    await lab.admin.ssh_revoke(g.serial, reason="done")
    await converged(lab)
    for n in NODES:
        assert krl_serials(lab, n) == [g.serial] and sshd_accepts(lab, n)
    assert not (lab.node_dir("n1") / "ssh" / "principals" / "oncall").exists()
    for n in NODES:
        node = await lab.admin.get_node(n)
        assert {s.section: s.state for s in node.sections}.get("access") == common_pb2.CONVERGED
