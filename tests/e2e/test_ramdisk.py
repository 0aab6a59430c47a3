"""A ramdisk end to end, as an operator drives it: `bc token create --role ramdisk`, `bc join`, `bc node` on fake
GPUs with its machine at `--machine-root`, then `bc nodes show`, `bc cmd run … disk.wipe`, `deploy.image` from a
real HTTP server and `boot.kexec`, which ends the ramdisk's process (the fake kexec edge).

The disks are a loop device under the real `/sys` where the kernel has loop devices, else the image file
in a fake tree (`Disk.mode`); the deployed and kexec'd disk is a fake tree's file either way.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import Lab
from tests.http_server import serving
from tests.ramdisk_disks import add_sys_disk, disk_under_test, loop_devices_available

MIB = 1 << 20


@pytest.fixture
def image(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A GPT image with one ext4 partition, served over HTTP; (url, sha256)."""
    raw = tmp_path / "os.raw"
    with raw.open("wb") as f:
        f.truncate(16 * MIB)
    subprocess.run(["sfdisk", "-q", str(raw)], input=b"label: gpt\n2048,24576,L\n", check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-E", f"offset={2048 * 512}", str(raw), "12M"], check=True)
    data = raw.read_bytes()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    with serving(Handler) as url:
        yield f"{url}/os.raw", hashlib.sha256(data).hexdigest()


@pytest.mark.e2e
def test_a_ramdisk_joins_wipes_deploys_and_kexecs(lab: Lab, tmp_path: Path, image: tuple[str, str]) -> None:
    mode = "file" if loop_devices_available() else "loop"
    with disk_under_test(mode, tmp_path / "wipe") as wiped:
        # The wipe goes through the disk's own tree: the real /sys and /dev/loopN, or the fake tree of the file.
        lab.serve()
        token = lab.token("r1", "--role", "ramdisk")
        lab.join("r1", token)
        lab.node("r1", extra=["--machine-root", str(wiped.tree.root)])
        lab.wait_for("r1 connected", lambda: lab.show("r1")["state"] == "connected" or None)

        shown = lab.bc("nodes", "show", "r1", json=False)
        assert "DISKS" in shown and wiped.name in shown, shown
        wipe = lab.bc("cmd", "run", "r1", "disk.wipe", "--payload", json.dumps({"disks": [wiped.name]}), "--wait")
        assert wipe["state"] == "succeeded" and wipe["attested"], wipe
        assert [d["disk"] for d in wipe["result"]["disks"]] == [wiped.name]
        assert wiped.image.read_bytes()[: 4 * MIB] == bytes(4 * MIB)

    # The machine reboots into a ramdisk again (a fake tree this time, with the disk the OS goes to).
    target = tmp_path / "target"
    add_sys_disk(target, "vdc", 32 * MIB)
    lab.kill("node-r1")
    lab.node("r1", extra=["--machine-root", str(target)])
    lab.wait_for("r1 with vdc", lambda: "vdc" in lab.bc("nodes", "show", "r1", json=False) or None)
    url, sha = image
    deploy = {"url": url, "sha256": sha, "disk": "vdc"}
    done = lab.bc("cmd", "run", "r1", "deploy.image", "--payload", json.dumps(deploy), "--wait", timeout=60)
    assert done["state"] == "succeeded", done
    assert done["result"]["partition_table"]["partitions"][0]["fstype"] == "ext4", done

    kexec = {"disk": "vdc", "partition": 1, "kernel": "/boot/vmlinuz", "cmdline": "root=LABEL=os ro"}
    lab.bc("cmd", "run", "r1", "boot.kexec", "--payload", json.dumps(kexec))
    code = lab.procs["node-r1"].popen.wait(timeout=30)
    assert code == 0, lab.log("node-r1")  # the ramdisk is gone, cleanly
    plan = json.loads((lab.node_dir("r1") / "kexec.json").read_text())
    assert plan["offset_bytes"] == 2048 * 512 and plan["cmdline"] == "root=LABEL=os ro"
