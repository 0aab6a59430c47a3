"""Snapshots, restores and the identity rebind over the fake runtime, with real https on 127.0.0.1.

`instance.snapshot` captures (the fake runtime's disk and memory state), tars, hashes and PUTs to a real
TLS server under a bc CA; a second instance's `restore_from` downloads it in the background (the section
PROGRESSING meanwhile), verifies it and boots from it; the rebind hands the fake guest (a compliant one)
its identity. Failures fail the instance with a sentence: an http:// URL, a digest mismatch, a redirect to
http, another CPU model; a stalled upload ends. The same against a real qemu guest is
tests/integration/test_instances_qemu_snapshots.py (slow).
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agent.converge.run import CONVERGED, FAILED, PROGRESSING, SectionResult
from agent.converge.secret_port import SecretRefused
from agent.instances.admission import HostMemory
from agent.instances.fake import FakeRuntime
from agent.instances.fake_snapshot import FakeSnapshots
from agent.instances.snapshot_meta import GPU_REFUSAL, VOLUME_REFUSAL, SnapshotMeta
from agent.instances.transfer import Limits
from agent.kinds import InvalidPayload
from agent.offload import to_thread
from bc.protocol.pb import spec_pb2
from tests.snapshot_https import ObjectStore
from tests.snapshot_node import SnapshotNode

BUNDLE = json.dumps({"v": 1, "account": "tenant", "principals": ["restore-1"]}).encode()


class Node(SnapshotNode):
    runtime: FakeRuntime
    adapter: FakeSnapshots

    def __init__(self, tmp: Path, store: ObjectStore, limits: Limits) -> None:
        data = tmp / "data"
        boot = data / "instance-boot"
        boot.mkdir(parents=True)
        (boot / "vmlinuz").write_bytes(b"kernel")
        runtime = FakeRuntime(data / "fake-instances.json", to_thread)
        super().__init__(
            data,
            boot,
            runtime,
            FakeSnapshots(runtime, data / "fake-instances", to_thread),
            self._memory,
            ca_pem=store.ca_pem,
            limits=limits,
            cdi_dir=tmp / "cdi",
            answer_s=0.3,
            poll_s=0.02,
            retry_s=60.0,
            rebind_retry_s=0.0,
        )

    async def _memory(self) -> HostMemory | None:
        return HostMemory(64 * 1024)

    async def converge(self, *instances: spec_pb2.Instance) -> SectionResult:
        return await self.section(*instances)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[ObjectStore]:
    async with ObjectStore(tmp_path) as s:
        yield s


@pytest.fixture
async def node(tmp_path: Path, store: ObjectStore) -> AsyncIterator[Node]:
    # a window long enough for a TLS handshake on a loaded machine, short enough for the stall tests
    n = Node(tmp_path, store, Limits(min_bytes=64, window_s=3.0, max_s=30.0))
    yield n
    await n.close()


def vm(iid: str, **kw: Any) -> spec_pb2.Instance:
    return spec_pb2.Instance(**{"id": iid, "runtime": "qemu", "vcpus": 2, "memory_mib": 512, "kernel": "vmlinuz", **kw})


def clone(iid: str, url: str, sha: str, **kw: Any) -> spec_pb2.Instance:
    return vm(iid, restore_from=spec_pb2.RestoreFrom(url=url, sha256=sha), **kw)


async def rebind_pass(node: Node, iid: str, *spec: spec_pb2.Instance) -> None:
    """One converger pass, then the rebind try it started for `iid` (if it started one) to its end."""
    await node.converge(*spec)
    task = node.rebinder._tasks.get(iid)
    if task is not None:
        await task


def members(tar: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(tar), mode="r:") as t:
        return {m.name: t.extractfile(m).read() for m in t}  # type: ignore[union-attr]


async def test_a_memory_snapshot_is_uploaded_and_restores_into_a_clone(node: Node, store: ObjectStore) -> None:
    assert (await node.converge(vm("src"))).reported_state == CONVERGED
    got = await node.snapshot("src", store.url("/o/snap-1?X-Amz-Signature=secret"))
    assert got.ok, got.message
    body = store.objects["snap-1"]
    sha = hashlib.sha256(body).hexdigest()
    assert got.result == {
        "instance_id": "src",
        "include_memory": True,
        "sha256": sha,
        "bytes": len(body),
        "uploaded_to": store.url("/o/snap-1"),
        "status": 200,
    }
    assert "secret" not in json.dumps(got.result)
    tar = members(body)
    assert list(tar) == ["meta.json", "disk.qcow2", "memory.state"]
    assert json.loads(tar["meta.json"]) == {
        "v": 1,
        "runtime": "qemu",
        "cpu_model": "fake-cpu",
        "include_memory": True,
        "vcpus": 2,
        "memory_mib": 512,
        "disk": True,
    }
    assert not list((node.data / "snapshots").iterdir())  # the staging and the tar are gone after the upload

    # the clone waits on the download (PROGRESSING), then runs from it
    spec = (vm("src"), clone("copy", store.url("/o/snap-1"), sha))
    first = await node.converge(*spec)
    assert (first.reported_state, first.reason) == (PROGRESSING, "SnapshotPending")
    assert node.status("copy").state == "STOPPED" and "waiting for the snapshot" in node.status("copy").message
    await node.woke()
    assert (await node.converge(*spec)).reported_state == CONVERGED
    assert (node.status("copy").state, node.status("copy").restored_from) == ("RUNNING", sha)
    assert node.status("src").restored_from == ""
    restored = node.data / "fake-instances" / "copy"
    assert (restored / "memory.state").read_bytes() == b"fake memory of src\n"
    assert json.loads((restored / "restored.json").read_text()) == {"sha256": sha, "include_memory": True}
    assert (node.data / "snapshots" / f"restore-{sha}.tar").is_file()

    # no spec restores from it any more: the downloaded snapshot is deleted, and the clone's files
    await node.converge(vm("src"))
    assert not list((node.data / "snapshots").iterdir())
    assert not restored.exists()


async def test_a_disk_only_snapshot_restores_without_memory(node: Node, store: ObjectStore) -> None:
    await node.converge(vm("src", state="STOPPED"))
    got = await node.snapshot("src", store.url("/o/disk"), memory=False)
    assert got.ok, got.message
    assert list(members(store.objects["disk"])) == ["meta.json", "disk.qcow2"]
    sha = got.result["sha256"]
    spec = clone("copy", store.url("/o/disk"), sha, vcpus=4, memory_mib=1024)  # a disk restores into any size
    await node.converge(spec)
    await node.woke()
    assert (await node.converge(spec)).reported_state == CONVERGED
    assert node.status("copy").restored_from == sha


async def test_a_memory_snapshot_of_a_stopped_instance_fails_with_a_sentence(node: Node, store: ObjectStore) -> None:
    await node.converge(vm("src", state="STOPPED"))
    got = await node.snapshot("src", store.url("/o/x"))
    assert (got.ok, got.reason) == (False, "snapshot-failed")
    assert "is stopped: a memory snapshot needs it running or paused" in got.message


@pytest.mark.parametrize(
    ("inst", "refusal"),
    [
        (vm("g", gpus=["GPU-00000000-0000-0000-0000-000000000001"]), GPU_REFUSAL),
        (vm("v", volumes=[spec_pb2.VolumeAttachment(volume="data")]), VOLUME_REFUSAL),
    ],
)
async def test_a_memory_snapshot_with_gpus_or_a_writer_volume_is_refused(
    node: Node, store: ObjectStore, inst: spec_pb2.Instance, refusal: str
) -> None:
    node.spec = [inst]
    got = await node.snapshot(inst.id, store.url("/o/x"))
    assert (got.ok, got.reason, got.message) == (False, "snapshot-refused", refusal)
    assert store.requests == []


async def test_an_upload_url_must_be_https_and_a_stalled_peer_ends_the_upload(node: Node, store: ObjectStore) -> None:
    await node.converge(vm("src"))
    with pytest.raises(InvalidPayload, match="is not an https:// URL; snapshots move over https only"):
        await node.snapshot("src", f"http://127.0.0.1:{store.port}/o/x")  # refused before it is run
    async with asyncio.timeout(20):
        got = await node.snapshot("src", store.url("/hang/x"))
    assert (got.ok, got.reason) == (False, "upload-failed")
    assert "the transfer stalled" in got.message
    assert not list((node.data / "snapshots").iterdir())


async def _uploaded(node: Node, store: ObjectStore, name: str) -> str:
    await node.converge(vm("src"))
    got = await node.snapshot("src", store.url(f"/o/{name}"))
    assert got.ok, got.message
    return str(got.result["sha256"])


async def test_a_digest_mismatch_and_an_http_url_fail_the_instance(node: Node, store: ObjectStore) -> None:
    sha = await _uploaded(node, store, "s")
    wrong = "0" * 64
    spec = (vm("src"), clone("copy", store.url("/o/s"), wrong))
    await node.converge(*spec)
    await node.woke()
    result = await node.converge(*spec)
    assert (result.reported_state, result.reason) == (FAILED, "InstanceFailed")
    assert node.status("copy").state == "ERROR"
    assert node.status("copy").message == (
        f"snapshot download: the snapshot at {store.url('/o/s')} has sha256 {sha}, not the spec's {wrong}"
    )
    assert not list((node.data / "snapshots").iterdir())  # never kept
    plain = (vm("src"), clone("copy", f"http://127.0.0.1:{store.port}/o/s", sha))
    assert (await node.converge(*plain)).reported_state == FAILED
    assert node.status("copy").message.startswith("the spec's instance.restore_from.url must be an https:// URL")


async def test_redirects_are_followed_only_to_https(node: Node, store: ObjectStore) -> None:
    sha = await _uploaded(node, store, "s")
    bad = (vm("src"), clone("copy", store.url("/http/s"), sha))
    await node.converge(*bad)
    await node.woke()
    await node.converge(*bad)
    assert "redirects to 'http://127.0.0.1" in node.status("copy").message
    assert "is not an https:// URL" in node.status("copy").message
    good = (vm("src"), clone("copy", store.url("/to/s"), sha))
    await node.converge(*good)  # another URL: fetched at once, not after the failure's minute
    await node.woke()
    assert (await node.converge(*good)).reported_state == CONVERGED
    assert node.status("copy").restored_from == sha


def _tar(meta: SnapshotMeta) -> bytes:
    from agent.instances.fake_snapshot import flat_qcow2

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for name, data in (("meta.json", meta.encode()), ("disk.qcow2", flat_qcow2()), ("memory.state", b"m")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.mark.parametrize(
    ("meta", "why"),
    [
        (SnapshotMeta("qemu", "Intel Xeon", True, 2, 512, True), "restores only on the CPU model it was taken on"),
        (SnapshotMeta("libvirt-kvm", "fake-cpu", False, 2, 512, True), "taken by runtime 'libvirt-kvm'"),
        (SnapshotMeta("qemu", "fake-cpu", True, 1, 512, True), "of 1 vCPUs and 512 MiB restores only"),
    ],
)
async def test_a_snapshot_this_host_cannot_restore_fails_the_instance(
    node: Node, store: ObjectStore, meta: SnapshotMeta, why: str
) -> None:
    store.objects["other"] = _tar(meta)
    spec = clone("copy", store.url("/o/other"), hashlib.sha256(store.objects["other"]).hexdigest())
    await node.converge(spec)
    await node.woke()
    assert (await node.converge(spec)).reported_state == FAILED
    assert node.status("copy").state == "ERROR" and why in node.status("copy").message
    assert node.runtime.domain("copy") is None  # nothing was defined


async def test_a_memory_restore_takes_its_own_identity_once_the_guest_answers(node: Node, store: ObjectStore) -> None:
    sha = await _uploaded(node, store, "s")
    spec = (vm("src"), clone("copy", store.url("/o/s"), sha, identity_rebind_ref="copy-identity"))
    node.port.values["copy-identity"] = BUNDLE
    await node.converge(*spec)
    await node.woke()  # the download
    await node.converge(*spec)  # restored and started: the rebind runs off the pass
    assert node.status("copy").identity_rebound_ref == ""  # not before the guest answered
    await node.woke()  # the rebind
    await node.converge(*spec)
    assert node.status("copy").identity_rebound_ref == "copy-identity"
    assert [i for i, _ in node.adapter.rebinds] == ["copy"]
    assert json.loads((node.data / "instances-rebound.json").read_text()) == {"copy": "copy-identity"}
    assert not (node.data / "fake-instances" / "copy" / "rebind.img").exists()  # zeroed and deleted
    await node.converge(*spec)
    assert len(node.adapter.rebinds) == 1  # once per ref
    await node.converge(vm("src"))
    assert json.loads((node.data / "instances-rebound.json").read_text()) == {}


async def test_a_silent_guest_is_tried_three_times_and_a_refused_bundle_once(node: Node, store: ObjectStore) -> None:
    sha = await _uploaded(node, store, "s")
    node.adapter.silent = True
    node.port.values["id"] = BUNDLE
    spec = (vm("src"), clone("copy", store.url("/o/s"), sha, identity_rebind_ref="id"))
    await node.converge(*spec)
    await node.woke()
    for _ in range(5):
        await rebind_pass(node, "copy", *spec)
    assert node.rebinder.tries("copy", "id") == 3
    assert node.status("copy").identity_rebound_ref == ""
    assert not (node.data / "fake-instances" / "copy" / "rebind.img").exists()

    node.port.values["refused"] = SecretRefused("out-of-scope", "not this node's")
    refused = (vm("src"), clone("copy", store.url("/o/s"), sha, identity_rebind_ref="refused"))
    for _ in range(3):
        await rebind_pass(node, "copy", *refused)
    assert node.rebinder.tries("copy", "refused") == 0
    assert node.rebinder._tries[("copy", "refused")].given_up


async def test_a_stalled_download_fails_the_instance_and_leftovers_are_cleaned(node: Node, store: ObjectStore) -> None:
    leftover = node.data / "snapshots" / "upload-0123456789abcdef"
    leftover.mkdir(parents=True)
    (node.data / "snapshots" / "upload-0123456789abcdef.tar").write_bytes(b"half a tar")
    spec = clone("copy", store.url("/hang/s"), "a" * 64)
    async with asyncio.timeout(20):
        await node.converge(spec)
        await node.woke()
    assert (await node.converge(spec)).reported_state == FAILED
    assert node.status("copy").message.startswith("snapshot download: the transfer stalled: 0 bytes in 3 s")
    assert not list((node.data / "snapshots").iterdir())  # no partial download, no crashed upload


async def test_an_instance_of_a_runtime_without_snapshots_neither_restores_nor_is_snapshotted(
    node: Node, store: ObjectStore
) -> None:
    other = FakeRuntime(node.data / "other-instances.json", to_thread)
    other.name = "libvirt"  # a second runtime of the node, as libvirt is beside qemu (it takes no snapshots)
    node.conv.runtimes["libvirt"] = other
    result = await node.converge(
        vm("lv", runtime="libvirt"), clone("lv-clone", store.url("/o/x"), "a" * 64, runtime="libvirt")
    )
    assert result.state == FAILED
    assert node.status("lv").state == "RUNNING"
    assert node.status("lv-clone").message == "it restores from a snapshot, and runtime libvirt takes none"
    got = await node.snapshot("lv", store.url("/o/lv"))
    assert got.ok is False and got.message == "instance lv runs on runtime libvirt, which takes no snapshots"
