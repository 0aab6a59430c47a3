"""What `bc nodes` loads as it starts: not what only a write, a refused call or the tunnels' commands need.

Every `bc` call pays for its imports (docs/design.md "The CLI's start-up"); `tempfile` (with shutil, bz2, lzma
and random: about 4 ms) is for `atomic_write` and the refused-certificate probe, the tunnels' service for
`bc tunnels`. Run in a new interpreter, as `bc` starts: this test process imported them long ago.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

DEFERRED = ("tempfile", "shutil", "bz2", "lzma", "random", "bc.protocol.pb.tunnel_pb2", "bc.wire.stubs.tunnel_pb2_grpc")


def test_the_nodes_command_loads_neither_tempfile_nor_the_tunnels_service() -> None:
    code = (
        "import json, sys\n"
        "import bc.cli.main, bc.cli.admin_cmds, bc.cli.connect, bc.client.admin\n"
        f"print(json.dumps(sorted(m for m in {DEFERRED!r} if m in sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout) == []


def test_what_they_serve_still_loads_them_when_used(tmp_path: Path) -> None:
    code = (
        "import json, pathlib, sys\n"
        "from bc.runtime.files import atomic_write\n"
        f"atomic_write(pathlib.Path({str(tmp_path)!r}) / 'f', b'x')\n"
        "print(json.dumps('tempfile' in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout) is True
    assert (tmp_path / "f").read_bytes() == b"x"


def test_a_command_that_called_the_server_ends_without_the_last_collections(tmp_path: Path) -> None:
    """Python's shutdown collects garbage among every object the imports made (35–60 ms of a `bc` call on a
    loaded machine): a command's process freezes them at exit instead (`bc.cli.connect.run_client`)."""
    code = (
        "import atexit, gc, os\n"
        "atexit.register(lambda: print(gc.get_freeze_count() > 0))  # runs after bc's own (last in, first out)\n"
        "from bc.cli.connect import run_client\n"
        "from bc.errors import BcError\n"
        "try:\n"
        "    run_client(lambda client: client.server_info())\n"
        "except BcError:\n"
        "    pass  # no operator config here: the call is not the point\n"
        "print(gc.get_freeze_count() > 0)\n"
    )
    env = {**os.environ, "HOME": str(tmp_path), "BC_DATA_DIR": str(tmp_path / "none"), "BC_CONFIG": ""}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert done.stdout.split() == ["False", "True"]  # nothing frozen while it ran, everything once it ended
