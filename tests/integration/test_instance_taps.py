"""agent.instances.net.taps on real netlink, in a private network namespace (`unshare -n`): a tap made owned by
the given user, put on its bridge and up; moved when its bridge changes; a missing bridge, something that is
not a bridge, or an interface of the tap's name that is not a tap refused; removal of taps only; the host's
addresses on the bridges."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent.instances.net.names import tap_name

REPO = Path(__file__).resolve().parents[2]


def test_taps_on_real_netlink_in_a_private_namespace() -> None:
    for tool in ("unshare", "ip"):
        if shutil.which(tool) is None:
            pytest.fail(f"needs {tool} (util-linux, iproute2)")
    done = subprocess.run(
        ["unshare", "-n", sys.executable, "-m", "tests.integration.netns_taps"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["made"] == {"master": "br0", "up": True, "kind": "tun", "owner": 4242, "persist": True, "pi": False}
    assert got["moved_to"] == "br1" and got["owner_now"] == 4343
    assert got["no_bridge"] == "the bridge br9 does not exist on this host"
    assert got["not_a_bridge"] == "the bridge lo does not exist on this host"
    assert got["not_a_tap"] == "an interface named bcdummy exists and is not a tap; it is left alone"
    assert got["left"] == ["bcdummy"] and tap_name("web", 1) not in got["left"]
    assert got["host"] == {"v4": ["10.0.0.1"], "v6": ["fd00::1"]}
