"""The real GPUs, read through NVML (`pynvml`, from the optional `nvidia-ml-py`).

A node without NVIDIA's library or driver is still a node (a CPU host, a
laptop running the agent): when `pynvml` is missing or `nvmlInit` fails, the
inventory has no GPUs and `source="none"` instead of the agent failing to
start. A GPU that NVML cannot fully read is reported unhealthy, not dropped,
so its holds stay visible.

Diagnostics ask NVML one counter at a time, each guarded: an old GPU without
row remapping, or a driver that refuses a query, yields null for that
counter rather than failing the whole command. Recent XIDs are not an NVML
query (NVML only reports XIDs that happen while one listens); they come
from the kernel log, where the driver writes them, through an `XidSource`:
`/dev/kmsg` read directly (`KmsgXids`: root, or `kernel.dmesg_restrict = 0`),
or, on an unprivileged node, the XIDs `bc helper` streams
(agent.helper.node_ops.HelperXids). GPU resets and reboots run the vendor's
tools, and only when the agent's config allows it.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import re
import shutil
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol

from agent.health.readings import HealthSource
from agent.hw import topology
from agent.hw.base import UNKNOWN_GPU, ActionDisabled, Capabilities, diag_entry, read_boot_id, run_process
from agent.hw.nvml_health import NvmlHealthSource
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


KMSG_PATH = Path("/dev/kmsg")
MAX_XIDS_PER_GPU = 20
RESET_TIMEOUT_S = 240.0
RESET_DISABLED = "gpu reset is disabled in this agent's config"
REBOOT_DISABLED = "reboot is disabled in this agent's config"

# `NVRM: Xid (PCI:0000:18:00): 79, pid=..., GPU has fallen off the bus.`
_XID = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f]+):([0-9A-Fa-f]+):([0-9A-Fa-f]+)(?:\.[0-9A-Fa-f]+)?\): (\d+),\s*(.*)")


def pci_key(bus_id: str) -> tuple[int, int, int] | None:
    """(domain, bus, device) of `00000000:18:00.0` (NVML) or `0000:18:00` (the kernel log); None if neither."""
    parts = bus_id.split(".")[0].split(":")
    if len(parts) != 3:
        return None
    try:
        return int(parts[0], 16), int(parts[1], 16), int(parts[2], 16)
    except ValueError:
        return None


def parse_kmsg_xids(text: str) -> dict[tuple[int, int, int], list[dict[str, Any]]]:
    """The XIDs in kernel log records (`/dev/kmsg` format, or plain `dmesg` lines), by PCI address, oldest first."""
    found: dict[tuple[int, int, int], list[dict[str, Any]]] = {}
    for line in text.splitlines():
        header, sep, message = line.partition(";")
        if not sep:
            message, header = line, ""
        m = _XID.search(message)
        if m is None:
            continue
        key = (int(m.group(1), 16), int(m.group(2), 16), int(m.group(3), 16))
        xid: dict[str, Any] = {"xid": int(m.group(4)), "message": m.group(5).strip()}
        fields = header.split(",")
        if len(fields) >= 3 and fields[2].isdigit():
            xid["uptime_s"] = round(int(fields[2]) / 1e6, 3)
        found.setdefault(key, []).append(xid)
    return {k: v[-MAX_XIDS_PER_GPU:] for k, v in found.items()}


def read_kmsg(path: Path) -> str | None:
    """Every record the kernel log still holds, or None when it cannot be read (no permission, not Linux).

    `/dev/kmsg` hands out one record per read and EAGAIN at the end when
    opened non-blocking; a plain file (tests) reads to EOF.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    chunks: list[bytes] = []
    try:
        while True:
            try:
                chunk = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno == errno.EPIPE:  # records were overwritten while we read: carry on
                    continue
                return None if not chunks else b"".join(chunks).decode("utf-8", "replace")
            if not chunk:
                break
            chunks.append(chunk if chunk.endswith(b"\n") else chunk + b"\n")
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace")


XidsByPci = dict[tuple[int, int, int], list[dict[str, Any]]]


class XidSource(Protocol):
    def by_pci(self) -> XidsByPci | None:
        """The XIDs of this boot by PCI address (domain, bus, device), oldest first, at most MAX_XIDS_PER_GPU
        each; None when the kernel log cannot be read. Called off the loop (diag runs in the offload)."""
        ...


class KmsgXids:
    """The kernel log read directly, on each call."""

    def __init__(self, path: Path = KMSG_PATH) -> None:
        self.path = path

    def by_pci(self) -> XidsByPci | None:
        text = read_kmsg(self.path)
        return None if text is None else parse_kmsg_xids(text)


def _query(fn: Callable[..., Any], *args: Any) -> Any:
    """One NVML query; None when NVML cannot answer it (not supported, no permission, GPU lost)."""
    try:
        return fn(*args)
    except Exception:
        return None


def _nvml_health(data_dir: Path, faults: Sequence[str]) -> HealthSource:
    """NVML's own counters and events; real GPUs take no injected faults."""
    return NvmlHealthSource(data_dir)


class NvmlHardware:
    """A HardwareBackend over NVML; every call initializes and shuts NVML down again."""

    RESET_COMMAND: ClassVar[tuple[str, ...]] = ("nvidia-smi", "--gpu-reset", "-i")
    REBOOT_COMMAND: ClassVar[tuple[str, ...]] = ("systemctl", "reboot")

    def __init__(
        self, *, kmsg_path: Path = KMSG_PATH, sys_root: Path = Path("/"), xids: XidSource | None = None
    ) -> None:
        self._read = False
        self._last_error = ""
        self._gpu_count = 0
        self.kmsg_path = kmsg_path
        self.xids: XidSource = xids if xids is not None else KmsgXids(kmsg_path)
        self.sys_root = sys_root  # where /sys is read from (a test's tree of files)
        self.capabilities = Capabilities(touches_host=True, health=_nvml_health)

    def inventory(self) -> common_pb2.Inventory:
        inv = common_pb2.Inventory(
            hostname=socket.gethostname(),
            source="none",
            cpus=os.cpu_count() or 0,
            memory_bytes=_host_memory_bytes(),
            numa_nodes=topology.numa_nodes(self.sys_root),
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

    def _read_gpu(self, nvml: Any, index: int, gpu: common_pb2.Gpu) -> None:
        try:
            h = nvml.nvmlDeviceGetHandleByIndex(index)
            gpu.uuid = _text(nvml.nvmlDeviceGetUUID(h))
            gpu.name = _text(nvml.nvmlDeviceGetName(h))
            gpu.pci_bus_id = _text(nvml.nvmlDeviceGetPciInfo(h).busId)
            numa = topology.pci_numa_node(gpu.pci_bus_id, self.sys_root)
            if numa is not None:
                gpu.numa_node = numa
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

    def diag(self, uuids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """NVML's health counters per GPU, each counter guarded; every GPU is unknown when NVML is not there."""
        out: dict[str, dict[str, Any]] = {}
        try:
            import pynvml
        except ImportError:
            return {u: {"error": UNKNOWN_GPU} for u in uuids}
        try:
            pynvml.nvmlInit()
        except Exception as e:
            log.warning("event=nvml.unavailable error=%r", str(e))
            return {u: {"error": UNKNOWN_GPU} for u in uuids}
        try:
            handles: dict[str, tuple[int, Any]] = {}
            count = _query(pynvml.nvmlDeviceGetCount) or 0
            for index in range(int(count)):
                h = _query(pynvml.nvmlDeviceGetHandleByIndex, index)
                gpu_uuid = _query(pynvml.nvmlDeviceGetUUID, h) if h is not None else None
                if gpu_uuid is not None:
                    handles[_text(gpu_uuid)] = (index, h)
            xids = self._xids_by_pci() if handles else None
            for gpu_uuid in uuids or list(handles):
                if gpu_uuid not in handles:
                    out[gpu_uuid] = {"error": UNKNOWN_GPU}
                    continue
                index, h = handles[gpu_uuid]
                out[gpu_uuid] = self._diag_one(pynvml, index, h, xids)
        finally:
            try:
                pynvml.nvmlShutdown()
            except Exception:
                pass
        return out

    def _xids_by_pci(self) -> XidsByPci | None:
        return self.xids.by_pci()

    @staticmethod
    def _diag_one(
        nvml: Any, index: int, h: Any, xids: dict[tuple[int, int, int], list[dict[str, Any]]] | None
    ) -> dict[str, Any]:
        def const(name: str, default: int) -> int:
            return int(getattr(nvml, name, default))

        def fn(name: str) -> Callable[..., Any]:
            f: Callable[..., Any] = getattr(nvml, name, _missing)
            return f

        def ecc(uncorrected: bool, aggregate: bool) -> int | None:
            error_type = (
                const("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
                if uncorrected
                else const("NVML_MEMORY_ERROR_TYPE_CORRECTED", 0)
            )
            counter = const("NVML_AGGREGATE_ECC", 1) if aggregate else const("NVML_VOLATILE_ECC", 0)
            value = _query(fn("nvmlDeviceGetTotalEccErrors"), h, error_type, counter)
            return None if value is None else int(value)

        def clock(name: str, default: int) -> int | None:
            value = _query(fn("nvmlDeviceGetClockInfo"), h, const(name, default))
            return None if value is None else int(value)

        def milliwatts(fn_name: str) -> float | None:
            value = _query(fn(fn_name), h)
            return None if value is None else round(int(value) / 1000.0, 1)

        volatile = {"corrected": ecc(False, False), "uncorrected": ecc(True, False)}
        aggregate = {"corrected": ecc(False, True), "uncorrected": ecc(True, True)}
        ecc_doc = (
            None
            if all(v is None for d in (volatile, aggregate) for v in d.values())
            else {
                "volatile": volatile,
                "aggregate": aggregate,
            }
        )

        retired_pages: dict[str, Any] | None = None
        single = _query(
            fn("nvmlDeviceGetRetiredPages"), h, const("NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS", 0)
        )
        double = _query(fn("nvmlDeviceGetRetiredPages"), h, const("NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR", 1))
        pending = _query(fn("nvmlDeviceGetRetiredPagesPendingStatus"), h)
        if single is not None or double is not None or pending is not None:
            retired_pages = {
                "single_bit": None if single is None else len(single),
                "double_bit": None if double is None else len(double),
                "pending": None if pending is None else bool(pending),
            }

        row_remapping: dict[str, Any] | None = None
        rows = _query(fn("nvmlDeviceGetRemappedRows"), h)
        if isinstance(rows, tuple | list) and len(rows) == 4:
            corrected, uncorrected, is_pending, failure = rows
            row_remapping = {
                "corrected": int(corrected),
                "uncorrected": int(uncorrected),
                "pending": bool(is_pending),
                "failure": bool(failure),
            }

        clocks = {
            "graphics": clock("NVML_CLOCK_GRAPHICS", 0),
            "sm": clock("NVML_CLOCK_SM", 1),
            "memory": clock("NVML_CLOCK_MEM", 2),
        }
        temperature = _query(fn("nvmlDeviceGetTemperature"), h, const("NVML_TEMPERATURE_GPU", 0))
        bus = _query(lambda: _text(nvml.nvmlDeviceGetPciInfo(h).busId))
        key = pci_key(bus) if bus else None
        name = _query(fn("nvmlDeviceGetName"), h)
        return diag_entry(
            index=index,
            name=None if name is None else _text(name),
            ecc=ecc_doc,
            retired_pages=retired_pages,
            row_remapping=row_remapping,
            xids=None if xids is None or key is None else xids.get(key, []),
            clocks_mhz=None if all(v is None for v in clocks.values()) else clocks,
            temperature_c=None if temperature is None else int(temperature),
            power_w=milliwatts("nvmlDeviceGetPowerUsage"),
            power_limit_w=milliwatts("nvmlDeviceGetEnforcedPowerLimit"),
        )

    async def reset_gpu(self, uuid: str, *, allow: bool = False) -> tuple[bool, str]:
        """`nvidia-smi --gpu-reset -i <uuid>`, only when the agent's config allows GPU resets."""
        if not allow:
            return False, RESET_DISABLED
        argv = [*self.RESET_COMMAND, uuid]
        if shutil.which(argv[0]) is None:
            return False, f"{argv[0]} is not installed"
        try:
            res = await run_process(argv, timeout_s=RESET_TIMEOUT_S)
        except TimeoutError:
            return False, f"{argv[0]} did not finish within {RESET_TIMEOUT_S:.0f} s"
        if res.returncode != 0:
            return False, f"{argv[0]} exited {res.returncode}: {res.tail(500)}"
        return True, res.tail(500) or "reset"

    async def reboot(self, *, allow: bool = False) -> tuple[bool, str]:
        """`systemctl reboot`, only when the agent's config allows it; then wait to go down with the machine."""
        if not allow:
            raise ActionDisabled(REBOOT_DISABLED)
        argv = list(self.REBOOT_COMMAND)
        if shutil.which(argv[0]) is None:
            return False, f"{argv[0]} is not installed"
        res = await run_process(argv, timeout_s=60.0)
        if res.returncode != 0:
            return False, f"{' '.join(argv)} exited {res.returncode}: {res.tail(500)}"
        log.warning("event=node.rebooting")
        await asyncio.Event().wait()  # systemd stops the agent as the machine goes down
        raise AssertionError("unreachable")  # pragma: no cover


def _missing(*_args: Any) -> Any:
    """Stands in for an NVML function an old pynvml lacks: the query then reads as unanswered."""
    raise AttributeError("not in this pynvml")
