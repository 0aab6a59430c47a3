"""The real GPUs, read through NVML (`pynvml`, from the optional `nvidia-ml-py`).

A node without NVIDIA's library or driver is still a node (a CPU host, a
laptop running the agent): when `pynvml` is missing or `nvmlInit` fails, the
inventory has no GPUs and `source="none"` instead of the agent failing to
start. A GPU that NVML cannot fully read is reported unhealthy, not dropped,
so its holds stay visible.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

from agent.hw.base import read_boot_id
from bc.protocol.pb import common_pb2

log = logging.getLogger(__name__)


def _text(value: Any) -> str:
    """pynvml returns bytes before 11.5 and str after."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _host_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def _mig_profile(name: str) -> str:
    """`NVIDIA A100-SXM4-80GB MIG 3g.40gb` → `3g.40gb`."""
    return name.rsplit("MIG ", 1)[1].strip() if "MIG " in name else name


class NvmlHardware:
    """A HardwareBackend over NVML; every call initializes and shuts NVML down again."""

    def __init__(self) -> None:
        self._read = False
        self._last_error = ""
        self._gpu_count = 0

    def inventory(self) -> common_pb2.Inventory:
        inv = common_pb2.Inventory(
            hostname=socket.gethostname(),
            source="none",
            cpus=os.cpu_count() or 0,
            memory_bytes=_host_memory_bytes(),
        )
        self._read = True
        self._gpu_count = 0
        try:
            import pynvml
        except ImportError:
            self._last_error = "pynvml is not installed (pip install nvidia-ml-py)"
            return inv
        try:
            pynvml.nvmlInit()
        except Exception as e:  # NVMLError and friends: no driver, no GPU, no permission
            self._last_error = f"nvmlInit failed: {e}"
            log.warning("event=nvml.unavailable error=%r", str(e))
            return inv
        try:
            inv.source = "nvml"
            self._last_error = ""
            inv.driver_version = _text(pynvml.nvmlSystemGetDriverVersion())
            for index in range(int(pynvml.nvmlDeviceGetCount())):
                self._read_gpu(pynvml, index, inv.gpus.add(index=index))
        except Exception as e:
            self._last_error = f"NVML query failed: {e}"
            log.warning("event=nvml.query_failed error=%r", str(e))
        finally:
            try:
                pynvml.nvmlShutdown()
            except Exception:
                pass
        self._gpu_count = len(inv.gpus)
        return inv

    @staticmethod
    def _read_gpu(nvml: Any, index: int, gpu: common_pb2.Gpu) -> None:
        try:
            h = nvml.nvmlDeviceGetHandleByIndex(index)
            gpu.uuid = _text(nvml.nvmlDeviceGetUUID(h))
            gpu.name = _text(nvml.nvmlDeviceGetName(h))
            gpu.pci_bus_id = _text(nvml.nvmlDeviceGetPciInfo(h).busId)
            gpu.memory_mib = int(nvml.nvmlDeviceGetMemoryInfo(h).total) // (1 << 20)
            try:
                current, _pending = nvml.nvmlDeviceGetMigMode(h)
                gpu.mig_enabled = bool(current)
            except Exception:
                gpu.mig_enabled = False  # not a MIG-capable GPU
            if gpu.mig_enabled:
                for i in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(h))):
                    try:
                        m = nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
                    except Exception:
                        continue  # an empty MIG slot
                    gpu.mig_instances.add(
                        gi=int(nvml.nvmlDeviceGetGpuInstanceId(m)),
                        ci=int(nvml.nvmlDeviceGetComputeInstanceId(m)),
                        uuid=_text(nvml.nvmlDeviceGetUUID(m)),
                        profile=_mig_profile(_text(nvml.nvmlDeviceGetName(m))),
                    )
            gpu.healthy = True
        except Exception as e:
            gpu.healthy = False
            log.warning("event=nvml.gpu_unreadable index=%d error=%r", index, str(e))

    def boot_id(self) -> str:
        return read_boot_id()

    def describe(self) -> str:
        if not self._read:
            self.inventory()
        if self._last_error:
            return f"none ({self._last_error})"
        return f"nvml ({self._gpu_count} GPUs)"
