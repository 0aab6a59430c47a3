"""diag.nvml: seeded and stable on fake GPUs; on NVML every counter is guarded, and XIDs come from the kernel log."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from agent.hw.base import diag_healthy
from agent.hw.fake import FakeHardware
from agent.hw.nvml import NvmlHardware, parse_kmsg_xids, pci_key
from agent.kinds import REGISTRY
from bc.protocol.pb import kinds_pb2
from tests.unit.kinds.kind_helpers import FakeNode, pack

DIAG = REGISTRY["diag.nvml"]
KEYS = {
    "index",
    "name",
    "ecc",
    "retired_pages",
    "row_remapping",
    "xids",
    "clocks_mhz",
    "temperature_c",
    "power_w",
    "power_limit_w",
    "healthy",
}


def test_fake_diag_is_stable_per_node_and_gpu() -> None:
    a = FakeHardware("hgx-h100-8", "node-a").diag([])
    again = FakeHardware("hgx-h100-8", "node-a").diag([])
    other = FakeHardware("hgx-h100-8", "node-b").diag([])
    assert a == again
    assert len(a) == 8 and set(a) != set(other)
    assert list(a.values()) != list(other.values())  # another node's GPUs read differently
    for entry in a.values():
        assert set(entry) == KEYS and entry["healthy"] is True
        assert entry["ecc"]["volatile"]["uncorrected"] == 0 and entry["xids"] == []
    json.dumps(a)  # JSON-able as it stands


def test_fake_diag_of_a_subset_and_an_unknown_gpu() -> None:
    hw = FakeHardware("l4-slots-4", "node-a")
    all_gpus = hw.diag([])
    u = hw.inventory().gpus[2].uuid
    out = hw.diag([u, "GPU-nope"])
    assert out == {u: all_gpus[u], "GPU-nope": {"error": "unknown GPU"}}


async def test_the_kind_reports_every_gpu_by_default(node: FakeNode) -> None:
    res = await DIAG.run(node.ctx, DIAG.parse(pack(kinds_pb2.DiagNvmlRequest())))
    assert res.ok and res.result["healthy"] is True
    assert list(res.result["gpus"]) == [g.uuid for g in node.inv.gpus]


async def test_the_kind_flags_an_unknown_gpu(node: FakeNode) -> None:
    req = kinds_pb2.DiagNvmlRequest(gpu_uuids=[node.uuid(0), "GPU-nope"])
    res = await DIAG.run(node.ctx, DIAG.parse(pack(req)))
    assert res.ok and res.result["healthy"] is False
    assert res.result["gpus"]["GPU-nope"] == {"error": "unknown GPU"}
    assert "GPU-nope" in res.message


@pytest.mark.parametrize(
    ("change", "healthy"),
    [
        ({}, True),
        ({"ecc": {"volatile": {"uncorrected": 1}}}, False),
        ({"ecc": {"volatile": {"uncorrected": None}}}, True),
        ({"row_remapping": {"pending": True}}, False),
        ({"row_remapping": {"failure": True}}, False),
        ({"retired_pages": {"pending": True}}, False),
        ({"ecc": None, "row_remapping": None, "retired_pages": None}, True),
        ({"error": "unknown GPU"}, False),
    ],
)
def test_the_healthy_verdict(change: dict[str, Any], healthy: bool) -> None:
    entry: dict[str, Any] = {
        "ecc": {"volatile": {"uncorrected": 0}, "aggregate": {"uncorrected": 7}},
        "row_remapping": {"pending": False, "failure": False},
        "retired_pages": {"pending": False},
    }
    entry.update(change)
    assert diag_healthy(entry) is healthy


KMSG = """\
6,1200,5000000,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.90.07
4,1201,7250000,-;NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python, GPU has fallen off the bus.
4,1202,8000000,-;NVRM: Xid (PCI:0000:2a:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error
4,1203,9000000,-;NVRM: Xid (PCI:0000:18:00): 94, pid=99, Contained ECC error.
"""


def test_xids_are_read_from_the_kernel_log_by_pci_address() -> None:
    xids = parse_kmsg_xids(KMSG)
    assert xids[(0, 0x18, 0)] == [
        {"xid": 79, "message": "pid=1234, name=python, GPU has fallen off the bus.", "uptime_s": 7.25},
        {"xid": 94, "message": "pid=99, Contained ECC error.", "uptime_s": 9.0},
    ]
    assert [x["xid"] for x in xids[(0, 0x2A, 0)]] == [48]
    assert (
        parse_kmsg_xids("[  12.5] NVRM: Xid (PCI:0000:3a:00.0): 63, Row remapping event")[(0, 0x3A, 0)][0]["xid"] == 63
    )
    assert pci_key("00000000:18:00.0") == (0, 0x18, 0) == pci_key("0000:18:00")
    assert pci_key("garbage") is None


class NVMLError(Exception):
    pass


def fake_pynvml() -> types.ModuleType:
    """Two GPUs. GPU 0 answers everything with a pending row remap; GPU 1 (older) refuses ECC and row remapping."""
    m: Any = types.ModuleType("pynvml")

    def refuses(*_a: Any) -> Any:
        raise NVMLError("Not Supported")

    def ecc(h: int, error_type: int, counter: int) -> int:
        if h == 1:
            raise NVMLError("Not Supported")
        return {(0, 0): 3, (1, 0): 0, (0, 1): 40, (1, 1): 2}[(error_type, counter)]

    def remapped(h: int) -> tuple[int, int, int, int]:
        if h == 1:
            raise NVMLError("Not Supported")
        return (2, 0, 1, 0)

    m.NVML_MEMORY_ERROR_TYPE_CORRECTED, m.NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 0, 1
    m.NVML_VOLATILE_ECC, m.NVML_AGGREGATE_ECC = 0, 1
    m.nvmlInit = lambda: None
    m.nvmlShutdown = lambda: None
    m.nvmlDeviceGetCount = lambda: 2
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetUUID = lambda h: [b"GPU-0000", "GPU-1111"][h]
    m.nvmlDeviceGetName = lambda h: "NVIDIA H100 80GB HBM3"
    m.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=[b"00000000:18:00.0", "00000000:2A:00.0"][h])
    m.nvmlDeviceGetTotalEccErrors = ecc
    m.nvmlDeviceGetRetiredPages = lambda h, cause: [0x1000] if cause == 0 else []
    m.nvmlDeviceGetRetiredPagesPendingStatus = lambda h: 0
    m.nvmlDeviceGetRemappedRows = remapped
    m.nvmlDeviceGetClockInfo = lambda h, clock: [1980, 1980, 2619][clock]
    m.nvmlDeviceGetTemperature = lambda h, sensor: 41
    m.nvmlDeviceGetPowerUsage = lambda h: 118_500
    m.nvmlDeviceGetEnforcedPowerLimit = refuses
    return m  # type: ignore[no-any-return]


def test_nvml_diag_guards_each_query(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(KMSG)
    out = NvmlHardware(kmsg_path=kmsg).diag([])
    assert list(out) == ["GPU-0000", "GPU-1111"]
    g0, g1 = out["GPU-0000"], out["GPU-1111"]
    assert g0["ecc"] == {
        "volatile": {"corrected": 3, "uncorrected": 0},
        "aggregate": {"corrected": 40, "uncorrected": 2},
    }
    assert g0["row_remapping"] == {"corrected": 2, "uncorrected": 0, "pending": True, "failure": False}
    assert g0["retired_pages"] == {"single_bit": 1, "double_bit": 0, "pending": False}
    assert g0["clocks_mhz"] == {"graphics": 1980, "sm": 1980, "memory": 2619}
    assert (g0["temperature_c"], g0["power_w"], g0["power_limit_w"]) == (41, 118.5, None)
    assert [x["xid"] for x in g0["xids"]] == [79, 94]
    assert g0["healthy"] is False  # the pending row remap
    assert g1["ecc"] is None and g1["row_remapping"] is None
    assert [x["xid"] for x in g1["xids"]] == [48]
    assert g1["healthy"] is True  # nothing read says otherwise
    assert NvmlHardware(kmsg_path=kmsg).diag(["GPU-nope"]) == {"GPU-nope": {"error": "unknown GPU"}}


def test_nvml_diag_without_a_kernel_log_reports_xids_as_null(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    out = NvmlHardware(kmsg_path=tmp_path / "absent").diag(["GPU-1111"])
    assert out["GPU-1111"]["xids"] is None


def test_nvml_diag_without_pynvml_knows_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert NvmlHardware().diag([]) == {}
    assert NvmlHardware().diag(["GPU-1"]) == {"GPU-1": {"error": "unknown GPU"}}
