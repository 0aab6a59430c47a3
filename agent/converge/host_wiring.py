"""How `bc node` builds its `host` converger and device-node source from its options (agent.app calls these).

* `--no-host-units`: `ExternallyManaged` (a non-empty host section is
  UNSUPPORTED with `HostManagedExternally`; nothing is touched).
* `--fake-hw`: files under `--host-root`, default `<data dir>/host-root`
  (its sysfs seeded by agent.hw.fake_host), and every command through a
  `FakeRunner` that records to `<data dir>/fake-host-commands.jsonl` and
  hands `nvidia-smi` to the fake MIG model: a fake node never touches the
  host it runs on.
* otherwise: files under `--host-root` (default `/`) and real commands.
"""

from __future__ import annotations

from pathlib import Path

from agent.converge.host import ExternallyManaged, HostConverger
from agent.converge.host_ops import FAKE_COMMANDS_FILE, FAKE_HOST_ROOT, FakeRunner, HostOps
from agent.converge.run import Converger
from agent.hw.base import HardwareBackend, run_process
from agent.hw.dev_nodes import DeviceNodes, FakeDeviceNodes, HostDeviceNodes
from agent.hw.fake import FakeHardware
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
) -> Converger:
    if not host_units:
        return ExternallyManaged()
    if isinstance(hw, FakeHardware):
        root = host_root or data_dir / FAKE_HOST_ROOT
        await offload(seed_host_root, root, await offload(hw.inventory))
        runner = FakeRunner(
            tools={"nvidia-smi": hw.mig.handle}, log_file=data_dir / FAKE_COMMANDS_FILE, offload=offload
        )
        return HostConverger(HostOps(root, run=runner, offload=offload), hw, cdi_dir=cdi_dir)
    return HostConverger(HostOps(host_root or Path("/"), run=run_process, offload=offload), hw, cdi_dir=cdi_dir)


def device_nodes(hw: HardwareBackend) -> DeviceNodes:
    """The fake's nodes on fake hardware, else the host's /dev and /proc."""
    return FakeDeviceNodes() if isinstance(hw, FakeHardware) else HostDeviceNodes()
