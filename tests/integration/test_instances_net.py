"""Instance networks on real parts: two TCG guests on a bridge in a private network namespace, one honest and
one sending from a MAC and address that are not its own (tests/integration/netns_guests.py runs there under
`unshare -n`, so its bridge, taps and nftables tables never touch the host's).

The honest guest's frames reach the bridge, but with network policy NONE only those for the host (its pings
beyond the host are seen on its tap, never on the bridge); the spoofer's are seen on its tap and never on the
bridge; a
flushed table lets them through until the 5-s guard puts it back, and then they stop again; deleting the
instances deletes their taps. In `make test-slow`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent.converge.run import CONVERGED
from agent.instances.net.names import tap_name
from tests.qemu_guest import kernel, vm_data_dir

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def test_a_spoofing_guests_frames_never_leave_its_tap_and_a_flushed_table_comes_back() -> None:
    kernel()  # fails the test, saying what it needs, without qemu, busybox or the cloud kernel
    for tool in ("unshare", "nft", "ip"):
        if shutil.which(tool) is None:
            pytest.fail(f"needs {tool} (util-linux, nftables, iproute2)")
    work = vm_data_dir()  # its VMMs run as their own users: a directory they can reach
    try:
        done = subprocess.run(
            ["unshare", "-n", sys.executable, "-m", "tests.integration.netns_guests", str(work)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=400,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["converged"] == CONVERGED and got["states"] == {"honest": "RUNNING", "spoofer": "RUNNING"}
    assert got["rules"]["inet bc_taps"] == 4 and got["rules"]["arp bc_taps"] == 2
    one = got["phase1"]
    assert one["honest_on_bridge"] >= 3 and one["forged_on_tap"] >= 3
    assert one["forged_on_bridge"] == 0, "a spoofed frame got past the bridge table"
    # network_policy NONE: the honest guest reaches the host, and nothing beyond it
    assert one["honest_to_host_on_bridge"] >= 1 and one["honest_beyond_on_tap"] >= 2
    assert one["honest_beyond_on_bridge"] == 0, "a NONE guest's packet for beyond the host got past its rules"
    assert got["phase2_forged_on_bridge"] >= 1, "with the table flushed the watch must see the forged frames"
    assert got["restored_after_s"] <= 11  # the guard's 5-s pass, plus a reload
    three = got["phase3"]
    assert three["restores"] == 1 and three["forged_on_tap"] >= 3 and three["forged_on_bridge"] == 0
    assert got["taps_before_delete"] == sorted([tap_name("honest", 0), tap_name("spoofer", 0)])
    assert got["deleted"] == CONVERGED and got["taps_left"] == []
