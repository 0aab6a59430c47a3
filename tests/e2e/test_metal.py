"""Provisioning end to end, as an operator drives it, every role a real process: `bc serve`; a site (`bc node
--site-no-dhcp`: its boot server's HTTP half, no dnsmasq on a real interface) driving sushy-tools' emulator;
`bc metal enroll` and `bc metal provision` (following its job); the machine's ramdisk (`bc join` + `bc node
--machine-root` on a disk image file, the fake kexec); its installed OS (`bc join` + `bc node`); `bc metal show`
provisioned.

What the hardware does is played by the test, and only that: the firmware's PXE boot fetches the machine's
iPXE script from the site (`/boot/<mac>.ipxe`, which carries the ramdisk's join token on its kernel command
line); after the kexec, the installed OS's boot is the test starting `bc node` with the token the kexec plan's
command line carries (no real reboot; no image glue reading /proc/cmdline).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.harness import Lab, free_port
from tests.ramdisk_disks import add_sys_disk
from tests.redfish_bmc import SYSTEM_MAC, RedfishBmcUnderTest, redfish_bmc

MIB = 1 << 20
KERNEL = b"a ramdisk kernel " * 512
INITRD = b"a ramdisk initramfs " * 512


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


@pytest.fixture
def bmc(tmp_path: Path) -> Iterator[RedfishBmcUnderTest]:
    (tmp_path / "bmc").mkdir()
    with redfish_bmc(tmp_path / "bmc") as b:
        yield b


@pytest.fixture
def images(tmp_path: Path) -> Iterator[dict[str, tuple[str, bytes]]]:
    path = tmp_path / "os.raw"
    with path.open("wb") as f:
        f.truncate(16 * MIB)
    subprocess.run(["sfdisk", "-q", str(path)], input=b"label: gpt\n2048,24576,L\n", check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-L", "os", "-E", f"offset={2048 * 512}", str(path), "12M"], check=True)
    files = {"vmlinuz": KERNEL, "initrd.img": INITRD, "os.raw": path.read_bytes()}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = files[self.path.rsplit("/", 1)[-1]]
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.2", 0), Handler)  # apart from the BMC's host
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    base = f"http://127.0.0.2:{server.server_address[1]}"
    try:
        yield {name: (f"{base}/{name}", body) for name, body in files.items()}
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.e2e
@pytest.mark.skipif(
    not (shutil.which("sfdisk") and shutil.which("mkfs.ext4") and shutil.which("blkid")),
    reason="needs util-linux's sfdisk and blkid and e2fsprogs' mkfs.ext4 (.ci/run installs fdisk)",
)
def test_a_machine_is_provisioned_from_enroll_to_a_joined_node(
    lab: Lab, tmp_path: Path, bmc: RedfishBmcUnderTest, images: dict[str, tuple[str, bytes]]
) -> None:
    creds = tmp_path / "bmc.json"
    creds.write_text(json.dumps({"default": {"username": "admin", "password": "pw"}}))
    creds.chmod(0o600)
    bmc.state.accounts["admin"] = "pw"
    lab.serve()
    lab.join("s1", lab.token("s1", "--role", "site"))
    lab.node("s1", extra=["--site-no-dhcp"])
    lab.wait_converged("s1")
    http = f"127.0.0.1:{free_port()}"
    section = {
        "credentialsFile": str(creds),
        "cacheImages": [{"url": url, "sha256": sha(body)} for url, body in images.values()],
        "boot": {"interface": "lo", "dhcpRange": "127.0.0.10,127.0.0.20", "httpAddress": http},
    }
    lab.bc("spec", "set", "s1", "site", json.dumps(section))
    lab.wait_converged("s1", 2, timeout=60)

    enrolled = lab.bc(
        "metal", "enroll", "m1", "--site", "s1", "--bmc", bmc.url, "--mac", SYSTEM_MAC, "--labels", "pool=gpu"
    )
    assert enrolled["machine"]["state"] == "enrolled", enrolled
    # `bc metal provision` follows its job to the end, as `bc jobs run` does (progress on stderr).
    provision = lab.spawn(
        "provision",
        "metal",
        "provision",
        "m1",
        "--image",
        "os.raw",
        "--ramdisk-kernel",
        sha(KERNEL),
        "--ramdisk-initrd",
        sha(INITRD),
    )

    # The machine PXE-boots: its script on the site carries the ramdisk's token (the job minted it).
    lab.wait_for(
        "m1's ramdisk to be awaited",
        lambda: lab.bc("metal", "show", "m1")["shown_state"] == "provisioning:ramdisk" or None,
        timeout=60,
    )
    script = httpx.get(f"http://{http}/boot/{SYSTEM_MAC}.ipxe", trust_env=False).text
    token = re.search(r"bc\.join_token=(\S+)", script)
    assert token is not None, script
    tree = tmp_path / "machine"
    disk = add_sys_disk(tree, "vda", 32 * MIB)
    lab.join("m1-ramdisk", token.group(1))
    lab.node("m1-ramdisk", extra=["--machine-root", str(tree)])

    # It wipes, deploys, kexecs (the ramdisk's process ends 0), and the installed OS boots with its own token.
    code = lab.procs["node-m1-ramdisk"].popen.wait(timeout=120)
    assert code == 0, lab.log("node-m1-ramdisk")
    assert disk.read_bytes()[: 16 * MIB] == images["os.raw"][1]
    plan = json.loads((lab.node_dir("m1-ramdisk") / "kexec.json").read_text())
    os_token = re.search(r"bc\.join_token=(\S+)", plan["cmdline"])
    assert os_token is not None, plan
    lab.join("m1", os_token.group(1))
    lab.node("m1")

    assert provision.popen.wait(timeout=120) == 0, lab.log("provision")
    shown = lab.bc("metal", "show", "m1")
    assert lab.job(shown["dag_id"])["state"] == "done"
    followed = lab.log("provision")
    assert f"job {shown['dag_id']}: metal.provision submitted" in followed and "13 nodes: 13✓" in followed, followed
    assert (shown["shown_state"], shown["node_id"]) == ("provisioned", "m1"), shown
    node = lab.show("m1")
    assert node["role"] == "node" and node["labels"]["pool"] == "gpu", node
    listed = lab.bc("metal", "list", json=False)
    assert "m1" in listed and "provisioned" in listed, listed
    assert httpx.get(f"http://{http}/boot/{SYSTEM_MAC}.ipxe", trust_env=False).status_code == 404
