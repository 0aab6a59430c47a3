"""The command kinds the agent executes: one executor per kind, found by name.

Only the executors live here; the dispatcher that journals, locks and
reports them is elsewhere and reaches them through `executor_for`.
"""

from __future__ import annotations

from agent.kinds.base import (
    InvalidPayload,
    KindContext,
    KindExecutor,
    KindResult,
)
from agent.kinds.boot_kexec import BootKexec
from agent.kinds.daemon_upgrade import DaemonUpgrade
from agent.kinds.deploy_image import DeployImage
from agent.kinds.diag_dcgm import DiagDcgm
from agent.kinds.diag_nvml import DiagNvml
from agent.kinds.disk_wipe import DiskWipe
from agent.kinds.gpu_reset import GpuReset
from agent.kinds.instance_snapshot import InstanceSnapshot
from agent.kinds.inventory_refresh import InventoryRefresh
from agent.kinds.logs_collect import LogsCollect
from agent.kinds.node_reboot import NodeReboot

__all__ = ["REGISTRY", "InvalidPayload", "KindContext", "KindExecutor", "KindResult", "executor_for"]

_EXECUTORS: tuple[KindExecutor, ...] = (
    InventoryRefresh(),
    DiagNvml(),
    GpuReset(),
    NodeReboot(),
    LogsCollect(),
    DiagDcgm(),
    DaemonUpgrade(),
    InstanceSnapshot(),
    # the ramdisk role's (agent/ramdisk/)
    DiskWipe(),
    DeployImage(),
    BootKexec(),
)

REGISTRY: dict[str, KindExecutor] = {e.name: e for e in _EXECUTORS}


def executor_for(kind: str) -> KindExecutor | None:
    """The executor of a kind, or None when this agent does not run it (the dispatcher answers UNSUPPORTED)."""
    return REGISTRY.get(kind)
