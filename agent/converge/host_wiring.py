"""How `bc node` builds its `host` converger and device-node source from its options (agent.app calls these).

* `--no-host-units`: `ExternallyManaged` (a non-empty host section is
  UNSUPPORTED with `HostManagedExternally`; nothing is touched).
* a backend that does not touch the host (`--fake-hw`; `Capabilities.touches_host`
  false): files under `--host-root`, default `<data dir>/host-root` (its sysfs
  seeded by agent.hw.fake_host), and every command through a `FakeRunner`
  that records to `<data dir>/fake-host-commands.jsonl` and hands the
  backend's own tools (the fake MIG model's `nvidia-smi`) their commands: a
  fake node never touches the host it runs on.
* otherwise: files under `--host-root` (default `/`) and real commands.

The backend says which through its capabilities (agent.hw.base.Capabilities), never through its type.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from agent.converge.host import ExternallyManaged, HostConverger
from agent.converge.host_ops import FAKE_COMMANDS_FILE, FAKE_HOST_ROOT, FakeRunner, HostOps
from agent.converge.run import Converger
from agent.converge.secret_port import SecretSource
from agent.hw.base import HardwareBackend, run_process
from agent.hw.dev_nodes import DeviceNodes, FakeDeviceNodes, HostDeviceNodes
from agent.hw.fake_host import seed_host_root
from agent.offload import Offload


async def host_converger(
    hw: HardwareBackend,
    data_dir: Path,
    cdi_dir: Path,
    *,
    host_root: Path | None,
    host_units: bool,
    offload: Offload,
    node_labels: Callable[[], Mapping[str, str]] = dict,
    secrets: SecretSource | None = None,
) -> Converger:
    if not host_units:
        return ExternallyManaged()
    if not hw.capabilities.touches_host:
        root = host_root or data_dir / FAKE_HOST_ROOT
        await offload(seed_host_root, root, await offload(hw.inventory), hw.capabilities.nvswitches)
        runner = FakeRunner(tools=hw.capabilities.tools, log_file=data_dir / FAKE_COMMANDS_FILE, offload=offload)
        ops = HostOps(root, run=runner, offload=offload)
        return HostConverger(ops, hw, cdi_dir=cdi_dir, node_labels=node_labels, secrets=secrets)
    ops = HostOps(host_root or Path("/"), run=run_process, offload=offload)
    return HostConverger(ops, hw, cdi_dir=cdi_dir, node_labels=node_labels, secrets=secrets)


def device_nodes(hw: HardwareBackend) -> DeviceNodes:
    """The host's /dev and /proc on a backend that touches the host, else the fake's nodes."""
    return HostDeviceNodes() if hw.capabilities.touches_host else FakeDeviceNodes()
