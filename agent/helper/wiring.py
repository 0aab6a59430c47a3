"""How an unprivileged `bc node` (`--helper-socket`) builds its seams: each helper-backed, its directories the helper's.

The helper says where its files live (`helper.hello`); the agent reads them
back there. A helper that does not answer at start is no reason to stop: the
agent takes the standard layout under `root` (`/`), logs it, and every
operation fails `helper: …` (retryable) until the helper is back.

Self-update goes through the helper only when the agent runs from the
helper's install dir (`/opt/bc/current`): the helper swaps its own install
dir, never one the agent names. XIDs come from the helper's stream when the
backend reads the kernel log (NVML; the fake backend makes its own).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from agent.converge.access import AccessConverger
from agent.converge.host import HostConverger
from agent.converge.host_ops import FakeRunner
from agent.helper.client import HelperClient, HelperError
from agent.helper.node_ops import (
    HelperHardware,
    HelperHoldFiles,
    HelperHostOps,
    HelperSlices,
    HelperSlots,
    HelperSshdFiles,
    HelperSshdTools,
    HelperXids,
)
from agent.helper.ops import Layout
from agent.hw.base import HardwareBackend, run_process
from agent.hw.nvml import NvmlHardware
from agent.offload import Offload
from bc.protocol.pb import common_pb2

log = logging.getLogger(__name__)

HOST_STATE_DIR = "host-state"
"""Under the data dir: the host units' records, the agent's own memory of what it applied."""
ACCESS_STATE_DIR = "access"
"""Under the data dir: the access converger's reload debt and the KRL's scratch files."""
UPGRADE_STAGE_DIR = "upgrade"
"""Under the data dir: where a release is downloaded and checked before the helper gets it."""


def key_chain(bundle: common_pb2.TrustBundle) -> list[tuple[bytes, bytes]]:
    """The bundle's release keys, each with its root's endorsement (empty when it carries none)."""
    sigs = {e.public_key: e.root_signature for e in bundle.release_key_endorsements}
    return [(k, sigs.get(k, b"")) for k in bundle.release_keys]


@dataclass
class HelperSeams:
    client: HelperClient
    layout: Layout
    hw: HelperHardware
    files: HelperHoldFiles
    slices: HelperSlices
    host: HostConverger
    access: AccessConverger
    data_dir: Path
    offload: Offload
    xids: HelperXids | None = None
    """Set when the backend reads the kernel log: `run` it beside the agent's loops."""

    def install_slots(self, install_dir: Path, bundle: Callable[[], common_pb2.TrustBundle]) -> HelperSlots | None:
        """The helper-backed A/B slots, when `install_dir` (where the agent runs from) is the helper's; else None
        (logged): the helper swaps only its own install dir."""
        if os.path.abspath(install_dir) != os.path.abspath(self.layout.install_dir):  # by name: no I/O on the loop
            log.warning(
                "event=upgrade.not-through-helper install_dir=%s helper_install_dir=%s;"
                " self-update needs bc node run from the helper's install dir",
                install_dir,
                self.layout.install_dir,
            )
            return None
        return HelperSlots(
            self.client,
            self.layout.install_dir,
            self.data_dir / UPGRADE_STAGE_DIR,
            lambda: key_chain(bundle()),
            offload=self.offload,
        )


async def helper_seams(
    socket_path: Path,
    hw: HardwareBackend,
    data_dir: Path,
    *,
    root: Path,
    offload: Offload,
    node_id: str = "",
    node_labels: Callable[[], Mapping[str, str]] = dict,
) -> HelperSeams:
    client = HelperClient(socket_path)
    try:
        hello = await client.call("helper.hello")
        layout = Layout(Path(hello["root"]))
    except (HelperError, KeyError, TypeError) as e:
        layout = Layout(root)
        log.warning("event=helper.unreachable socket=%s root=%s error=%r", socket_path, root, str(e))
    # Read-only queries run in the agent: on the host, or the fake's stand-ins under --fake-hw.
    query = run_process if hw.capabilities.touches_host else FakeRunner(tools=hw.capabilities.tools, offload=offload)
    ops = HelperHostOps(client, layout.root, data_dir / HOST_STATE_DIR, offload=offload, query=query)
    xids = None
    if isinstance(hw, NvmlHardware):  # the unprivileged agent reads no kernel log: the helper streams its XIDs
        xids = hw.xids = HelperXids(client, fallback=hw.xids)
    return HelperSeams(
        client=client,
        layout=layout,
        hw=HelperHardware(hw, client),
        files=HelperHoldFiles(client, layout.cdi_dir, layout.env_dir),
        slices=HelperSlices(client, layout.root, offload=offload),
        host=HostConverger(ops, hw, cdi_dir=layout.cdi_dir, node_labels=node_labels),
        access=AccessConverger(
            layout.ssh_dir,
            node_id,
            HelperSshdTools(client, offload=offload),
            offload=offload,
            files=HelperSshdFiles(client, layout.ssh_dir, offload=offload),
            state_dir=data_dir / ACCESS_STATE_DIR,
        ),
        data_dir=data_dir,
        offload=offload,
        xids=xids,
    )
