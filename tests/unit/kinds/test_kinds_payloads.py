"""Every kind refuses a payload that is not its request, and takes an empty Any as its default request."""

from __future__ import annotations

import pytest
from google.protobuf import any_pb2, struct_pb2
from google.protobuf.message import Message

from agent.kinds import REGISTRY, executor_for
from agent.kinds.base import ALL_GPUS, INVALID_PAYLOAD, InvalidPayload
from bc.protocol import kinds as kind_table
from bc.protocol.pb import kinds_pb2
from tests.unit.kinds.kind_helpers import FakeNode, pack

REQUESTS: dict[str, type[Message]] = {
    "inventory.refresh": kinds_pb2.InventoryRefreshRequest,
    "diag.nvml": kinds_pb2.DiagNvmlRequest,
    "gpu.reset": kinds_pb2.GpuResetRequest,
    "node.reboot": kinds_pb2.NodeRebootRequest,
    "logs.collect": kinds_pb2.LogsCollectRequest,
    "diag.dcgm": kinds_pb2.DiagDcgmRequest,
    "daemon.upgrade": kinds_pb2.DaemonUpgradeRequest,
    "instance.snapshot": kinds_pb2.InstanceSnapshotRequest,
    "disk.wipe": kinds_pb2.DiskWipeRequest,
    "deploy.image": kinds_pb2.DeployImageRequest,
    "boot.kexec": kinds_pb2.BootKexecRequest,
}


def test_the_registry_holds_registered_kinds_only() -> None:
    assert set(REGISTRY) == set(REQUESTS)
    assert set(REGISTRY) <= set(kind_table.KINDS)
    for name, executor in REGISTRY.items():
        assert executor.name == name and executor_for(name) is executor
    assert executor_for("bmc.power") is None
    assert executor_for("no.such.kind") is None


@pytest.mark.parametrize("kind", sorted(REQUESTS))
def test_a_wrong_any_type_is_invalid_payload(kind: str) -> None:
    wrong = pack(struct_pb2.Struct()) if kind != "gpu.reset" else pack(kinds_pb2.DiagNvmlRequest())
    with pytest.raises(InvalidPayload, match="expected"):
        REGISTRY[kind].parse(wrong)


@pytest.mark.parametrize("kind", sorted(REQUESTS))
def test_bytes_that_do_not_decode_are_invalid_payload(kind: str) -> None:
    broken = any_pb2.Any(type_url=f"type.googleapis.com/{REQUESTS[kind].DESCRIPTOR.full_name}", value=b"\xff\xff\xff")
    with pytest.raises(InvalidPayload, match="does not decode"):
        REGISTRY[kind].parse(broken)


def test_bytes_without_a_type_url_are_invalid_payload() -> None:
    with pytest.raises(InvalidPayload, match="no type_url"):
        REGISTRY["diag.nvml"].parse(any_pb2.Any(value=b"\x0a\x01x"))


@pytest.mark.parametrize("kind", ["inventory.refresh", "diag.nvml", "node.reboot", "logs.collect"])
def test_an_empty_any_is_the_default_request(kind: str) -> None:
    assert REGISTRY[kind].parse(any_pb2.Any()) == REQUESTS[kind]()


def test_a_packed_request_round_trips() -> None:
    req = kinds_pb2.GpuResetRequest(gpu_uuids=["GPU-1", "GPU-2", "GPU-1"])
    parsed = REGISTRY["gpu.reset"].parse(pack(req))
    assert parsed == req
    assert REGISTRY["gpu.reset"].resources(parsed) == ["gpu:GPU-1", "gpu:GPU-2"]


def test_gpu_reset_refuses_an_empty_list() -> None:
    for payload in (any_pb2.Any(), pack(kinds_pb2.GpuResetRequest())):
        with pytest.raises(InvalidPayload, match="empty"):
            REGISTRY["gpu.reset"].parse(payload)


@pytest.mark.parametrize("bad", ["-i", "GPU 1", "GPU-1/0/0", ""])
def test_gpu_reset_refuses_what_is_not_a_gpu_uuid(bad: str) -> None:
    with pytest.raises(InvalidPayload, match="not a GPU UUID"):
        REGISTRY["gpu.reset"].parse(pack(kinds_pb2.GpuResetRequest(gpu_uuids=["GPU-1", bad])))


@pytest.mark.parametrize("level", [0, -1, 5])
def test_diag_dcgm_refuses_a_bad_level(level: int) -> None:
    with pytest.raises(InvalidPayload, match="levels are 1-4"):
        REGISTRY["diag.dcgm"].parse(pack(kinds_pb2.DiagDcgmRequest(level=level)))


def test_diag_dcgm_default_request_has_no_level() -> None:
    with pytest.raises(InvalidPayload, match="level is 0"):
        REGISTRY["diag.dcgm"].parse(any_pb2.Any())


def test_diag_dcgm_locks_its_gpus_or_all_of_them() -> None:
    ex = REGISTRY["diag.dcgm"]
    assert ex.resources(ex.parse(pack(kinds_pb2.DiagDcgmRequest(level=1)))) == [ALL_GPUS]
    listed = ex.parse(pack(kinds_pb2.DiagDcgmRequest(level=3, gpu_uuids=["GPU-a", "GPU-b"])))
    assert ex.resources(listed) == ["gpu:GPU-a", "gpu:GPU-b"]


def test_locks_of_the_other_kinds() -> None:
    assert REGISTRY["inventory.refresh"].resources(kinds_pb2.InventoryRefreshRequest()) == []
    assert REGISTRY["diag.nvml"].resources(kinds_pb2.DiagNvmlRequest(gpu_uuids=["GPU-a"])) == []
    assert REGISTRY["logs.collect"].resources(kinds_pb2.LogsCollectRequest()) == []
    assert REGISTRY["node.reboot"].resources(kinds_pb2.NodeRebootRequest()) == [ALL_GPUS]


@pytest.mark.parametrize(
    ("request_", "match"),
    [
        (kinds_pb2.LogsCollectRequest(max_bytes=-1), "max_bytes"),
        (kinds_pb2.LogsCollectRequest(upload_url="ftp://example.com/x"), "http"),
        (kinds_pb2.LogsCollectRequest(upload_url="not a url"), "whitespace"),
        (kinds_pb2.LogsCollectRequest(upload_url="example.com/x"), "http"),
    ],
)
def test_logs_collect_refuses_bad_fields(request_: kinds_pb2.LogsCollectRequest, match: str) -> None:
    with pytest.raises(InvalidPayload, match=match):
        REGISTRY["logs.collect"].parse(pack(request_))


async def test_run_with_another_kinds_request_is_invalid_payload(node: FakeNode) -> None:
    res = await REGISTRY["gpu.reset"].run(node.ctx, kinds_pb2.DiagNvmlRequest())
    assert not res.ok and res.reason == INVALID_PAYLOAD


async def test_run_rechecks_a_request_it_did_not_parse(node: FakeNode) -> None:
    res = await REGISTRY["gpu.reset"].run(node.ctx, kinds_pb2.GpuResetRequest())
    assert (res.ok, res.reason) == (False, INVALID_PAYLOAD)
    assert node.resets() == {}
