"""How an unprivileged `bc node` (`--helper-socket`) builds its seams: each helper-backed, its directories the helper's.

The helper says where its files live (`helper.hello`); the agent reads them
back there. A helper that does not answer at start is no reason to stop: the
agent takes the standard layout under `root` (`/`), logs it, and every
operation fails `helper: …` (retryable) until the helper is back.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from agent.converge.access import AccessConverger
from agent.converge.host import HostConverger
from agent.helper.client import HelperClient, HelperError
from agent.helper.node_ops import (
    HelperHardware,
    HelperHoldFiles,
    HelperHostOps,
    HelperSlices,
    HelperSshdFiles,
    HelperSshdTools,
)
from agent.helper.ops import Layout
from agent.hw.base import HardwareBackend
from agent.offload import Offload

log = logging.getLogger(__name__)

HOST_STATE_DIR = "host-state"
"""Under the data dir: the host units' records, the agent's own memory of what it applied."""
ACCESS_STATE_DIR = "access"
"""Under the data dir: the access converger's reload debt and the KRL's scratch files."""


@dataclass
class HelperSeams:
    client: HelperClient
    layout: Layout
    hw: HelperHardware
    files: HelperHoldFiles
    slices: HelperSlices
    host: HostConverger
    access: AccessConverger


async def helper_seams(
    socket_path: Path, hw: HardwareBackend, data_dir: Path, *, root: Path, offload: Offload, node_id: str = ""
) -> HelperSeams:
    client = HelperClient(socket_path)
    try:
        hello = await client.call("helper.hello")
        layout = Layout(Path(hello["root"]))
    except (HelperError, KeyError, TypeError) as e:
        layout = Layout(root)
        log.warning("event=helper.unreachable socket=%s root=%s error=%r", socket_path, root, str(e))
    ops = HelperHostOps(client, layout.root, data_dir / HOST_STATE_DIR, offload=offload)
    return HelperSeams(
        client=client,
        layout=layout,
        hw=HelperHardware(hw, client),
        files=HelperHoldFiles(client, layout.cdi_dir, layout.env_dir),
        slices=HelperSlices(client, layout.root, offload=offload),
        host=HostConverger(ops, hw, cdi_dir=layout.cdi_dir),
        access=AccessConverger(
            layout.ssh_dir,
            node_id,
            HelperSshdTools(client, offload=offload),
            offload=offload,
            files=HelperSshdFiles(client, layout.ssh_dir, offload=offload),
            state_dir=data_dir / ACCESS_STATE_DIR,
        ),
    )
