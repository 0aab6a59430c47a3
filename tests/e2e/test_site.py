"""A site end to end, as an operator drives it: `bc token create --role site`, `bc join`, `bc node` (a real
process), `bc spec set … site`, then `bc cmd run … bmc.query / bmc.boot --wait` against sushy-tools'
emulator (tests/redfish_bmc.py), and `bc nodes show` with the section converged once its image is cached.

The boot server's DHCP half is not started here (it would answer on a real interface): its config and a
DHCP exchange are tested in a network namespace of their own (tests/integration/test_site_dnsmasq.py).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import Lab
from tests.redfish_bmc import SYSTEM_MAC, RedfishBmcUnderTest, redfish_bmc

IMAGE = b"a ramdisk initramfs " * 2048


@pytest.fixture
def bmc(tmp_path: Path) -> Iterator[RedfishBmcUnderTest]:
    (tmp_path / "bmc").mkdir()
    with redfish_bmc(tmp_path / "bmc") as b:
        yield b


@pytest.fixture
def image_url() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(IMAGE)))
            self.end_headers()
            self.wfile.write(IMAGE)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.2", 0), Handler)  # apart from the BMC's host
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.2:{server.server_address[1]}/initrd"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.e2e
def test_a_site_joins_caches_its_image_and_drives_a_bmc(
    lab: Lab, tmp_path: Path, bmc: RedfishBmcUnderTest, image_url: str
) -> None:
    creds = tmp_path / "bmc.json"
    creds.write_text(json.dumps({"default": {"username": "admin", "password": "old-password"}}))
    creds.chmod(0o600)
    lab.serve()
    lab.join("s1", lab.token("s1", "--role", "site"))
    lab.node("s1", extra=["--site-bmc-network", "10.9.0.0/24"])
    lab.wait_converged("s1")
    section = {
        "machines": [{"name": "m1", "bmcUrl": bmc.url, "macs": [SYSTEM_MAC]}],
        "credentialsFile": str(creds),
        "cacheImages": [{"url": image_url, "sha256": hashlib.sha256(IMAGE).hexdigest()}],
    }
    lab.bc("spec", "set", "s1", "site", json.dumps(section))
    shown = lab.wait_converged("s1", 2, timeout=60)
    assert shown["role"] == "site", shown
    assert (lab.node_dir("s1") / "site" / "images" / hashlib.sha256(IMAGE).hexdigest()).read_bytes() == IMAGE

    query = lab.bc("cmd", "run", "s1", "bmc.query", "--payload", '{"machine": "m1"}', "--wait")
    assert query["state"] == "succeeded", query
    assert SYSTEM_MAC in query["result"]["inventory"]["nics"]
    boot = lab.bc("cmd", "run", "s1", "bmc.boot", "--payload", '{"machine": "m1", "device": "pxe"}', "--wait")
    assert boot["state"] == "succeeded" and boot["result"]["boot"]["target"] == "Pxe", boot

    # A command that fails exits 8 with the reason in one line.
    r = lab.run("cmd", "run", "s1", "bmc.power", "--payload", '{"machine": "m9", "action": "on"}', "--wait")
    assert r.returncode == 8 and "failed: unknown-machine" in r.stderr, r
