"""`restore_from` and the identity rebind, as the `instances` converger runs them (docs/instances.md).

* `prepare` (each pass, for a spec instance with `restore_from`): an
  instance restored before boots its own disk (its directory's marker says
  from what); otherwise the snapshot must be downloaded and verified first.
  While it downloads the instance is waiting (`SnapshotPending`, the section
  PROGRESSING); a failed download, another runtime, a memory snapshot from
  another CPU model or of another size fail it. Ready: its define unpacks it.
* `unpack` (right after the define): the snapshot into the instance's
  directory, its disk checked; a failure deletes the new domain again.
* `after_pass`: snapshots no spec restores from are deleted, and so are uploads
  a crash left behind; a running
  memory-restored instance that names `identity_rebind_ref` is handed to the
  rebinder (off the pass); the report carries `restored_from` and
  `identity_rebound_ref`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Final, Protocol

from agent.converge.instance_rebind import Rebinder
from agent.instances.plan import ABSENT
from agent.instances.runtime import RUNNING, STOPPED, DomainConfig, InstanceRuntime, RuntimeFailure
from agent.instances.snapshot_meta import SnapshotError
from agent.instances.snapshots import Restored, Snapshots
from bc.protocol.pb import common_pb2, spec_pb2

REASON_SNAPSHOT_PENDING: Final = "SnapshotPending"


class Item(Protocol):
    """What of the converger's item a restore reads and sets."""

    spec: spec_pb2.Instance
    observed: str
    config: DomainConfig | None
    error: str
    waiting: str
    restore: str
    restored: Restored | None


async def prepare(snapshots: Snapshots | None, item: Item) -> None:
    inst, config = item.spec, item.config
    assert config is not None
    if snapshots is None:
        item.error = "it restores from a snapshot, and this host's runtime takes none"
        return
    if snapshots.runtime.name != inst.runtime:  # snapshots are one runtime's (libvirt takes none yet)
        item.error = f"it restores from a snapshot, and runtime {inst.runtime} takes none"
        return
    item.restored = await snapshots.restored(inst.id)
    disk = snapshots.disk_path(inst.id)
    if item.restored is not None:  # restored before: from now on it boots the disk it was restored with
        if await snapshots.offload(disk.is_file):
            item.config = dataclasses.replace(config, disk=disk, disk_format="qcow2")
        return
    if item.observed not in (ABSENT, STOPPED):
        return  # running without a marker: not one of ours to restore over
    rf = inst.restore_from
    fetch = await snapshots.status(rf.url, rf.sha256)
    if fetch.error:
        item.error = fetch.error
        return
    if fetch.path is None:
        item.waiting = f"{REASON_SNAPSHOT_PENDING}: waiting for the snapshot {rf.sha256[:12]} to download"
        return
    try:
        meta = await snapshots.peek(fetch.path, inst.vcpus, inst.memory_mib)
    except SnapshotError as e:
        item.error = f"restore: {e}"
        return
    except OSError as e:
        item.error = f"restore: cannot read the snapshot: {e.strerror or e}"
        return
    item.restore = rf.sha256
    if meta.disk:
        item.config = dataclasses.replace(config, disk=disk, disk_format="qcow2")


async def unpack(snapshots: Snapshots | None, runtime: InstanceRuntime, item: Item) -> None:
    """Unpack into the just-defined domain's directory; RuntimeFailure (and the domain deleted) when it fails."""
    assert snapshots is not None
    inst = item.spec
    try:
        meta = await snapshots.restore_into(inst.id, item.restore, inst.vcpus, inst.memory_mib)
    except (SnapshotError, OSError) as e:
        why = str(e) if isinstance(e, SnapshotError) else (e.strerror or str(e))
        try:
            await runtime.delete(inst.id)
        except RuntimeFailure:
            pass  # the instance fails either way; the next pass deletes what is left
        raise RuntimeFailure(f"restore: {why}") from None
    item.restored = Restored(item.restore, meta.include_memory)
    item.restore = ""


async def after_pass(
    snapshots: Snapshots | None,
    rebinder: Rebinder | None,
    items: Sequence[Item],
    statuses: list[common_pb2.InstanceStatus],
    generation: int,
) -> None:
    if snapshots is not None:
        await snapshots.prune({i.spec.restore_from.sha256 for i in items if i.spec.HasField("restore_from")})
        await snapshots.clean_uploads()
        await snapshots.forget({i.spec.id for i in items})
    rebound: dict[str, str] = {}
    if rebinder is not None:
        await rebinder.prune({i.spec.id for i in items})
        for i in items:
            ref = i.spec.identity_rebind_ref
            if ref and i.restored is not None and i.restored.include_memory and i.observed == RUNNING and not i.error:
                await rebinder.consider(i.spec.id, ref, i.spec.allocation_id, generation)
        rebound = await rebinder.rebound()
    by_id = {i.spec.id: i for i in items}
    for status in statuses:
        item = by_id.get(status.id)
        if item is None or not status.managed:
            continue
        if item.restored is not None:
            status.restored_from = item.restored.sha256
        ref = rebound.get(status.id, "")
        if ref and ref == item.spec.identity_rebind_ref:
            status.identity_rebound_ref = ref
