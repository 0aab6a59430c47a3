"""The boot server's DHCP half: the config the site agent gives dnsmasq, judged by dnsmasq itself.

* `dnsmasq --test` accepts the generated config (and refuses a broken one, so the check can fail);
* a real DHCP exchange in a network namespace of its own (`unshare -n`, a veth pair, tests/dhcp_probe.py
  sending a PXE ROM's raw frames): the MAC with a live lease is offered an address and the iPXE binary, and
  as iPXE the URL of the site's `boot.ipxe`; a MAC without a lease gets no answer, which dnsmasq logs as
  ignored. Needs root (CI runs as root) and the OS's dnsmasq (.ci/run installs it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from agent.site import boot_config
from agent.site.dnsmasq import check_config
from bc.protocol.pb import spec_pb2

ROOT = Path(__file__).resolve().parents[2]
LEASED, UNLEASED = "52:54:00:aa:bb:01", "52:54:00:aa:bb:02"


async def test_dnsmasq_accepts_the_generated_config(tmp_path: Path) -> None:
    boot = spec_pb2.SiteBootServer(
        interface="eth1", dhcp_range="10.2.0.10,10.2.0.99,255.255.255.0", http_address="10.2.0.1:8081"
    )
    conf = tmp_path / "dnsmasq.conf"
    conf.write_text(boot_config.dnsmasq_conf(boot, tmp_path))
    assert await check_config(conf) is None
    conf.write_text(boot_config.dnsmasq_conf(boot, tmp_path) + "dhcp-range=nonsense\n")
    why = await check_config(conf)
    assert why is not None and "bad dhcp-range" in why


def test_a_boot_dir_dnsmasq_cannot_read_fails_the_start_with_the_reason(tmp_path: Path) -> None:
    """pytest's tmp dirs are 0700: dnsmasq, once it drops to its own user, cannot reach its TFTP root."""
    out = subprocess.run(
        ["unshare", "-n", sys.executable, "-m", "tests.dhcp_probe", str(tmp_path / "boot"), LEASED, UNLEASED],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0
    assert "dnsmasq exited with code" in out.stderr and "unprivileged user" in out.stderr


def test_only_a_leased_mac_is_answered_and_sent_to_ipxe_then_the_site() -> None:
    # A boot dir dnsmasq's unprivileged user can read, as the site agent's must be (docs/metal.md).
    with tempfile.TemporaryDirectory(prefix="bc-site-boot-") as run_dir:
        os.chmod(run_dir, 0o755)
        report = _probe(run_dir)
    leased = report["offers"][LEASED]
    pxe = {o["file"] for o in leased if o["ipxe"] == "False"}
    ipxe = {o["file"] for o in leased if o["ipxe"] == "True"}
    assert pxe == {boot_config.IPXE_BIOS}
    assert ipxe == {"http://10.77.0.1:8081/boot.ipxe"}
    assert all(o["address"].startswith("10.77.0.") for o in leased)
    assert report["offers"][UNLEASED] == []
    assert any(f"{UNLEASED} ignored" in line for line in report["log"]), report["log"]


def _probe(run_dir: str) -> dict[str, Any]:
    out = subprocess.run(
        ["unshare", "-n", sys.executable, "-m", "tests.dhcp_probe", run_dir, LEASED, UNLEASED],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    report: dict[str, Any] = json.loads(out.stdout)
    return report
