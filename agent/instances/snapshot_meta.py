"""What a snapshot tar is, and the checks a restore makes of it: pure, no I/O.

A snapshot is a tar (uncompressed: the disk is already compact and the memory
state is mostly what the guest wrote) of at most three regular files, in
this order:

* `meta.json`: `{"v": 1, "runtime", "cpu_model", "include_memory", "vcpus",
  "memory_mib", "disk"}`, written by the node that took it;
* `disk.qcow2`: the root disk flattened onto its base (`qemu-img convert`), when
  the instance had one;
* `memory.state`: the VM's state (qemu's migration stream), with memory only.

A restore refuses (one sentence, which fails the instance) a tar with any
other member, a link or a member twice; one taken by another runtime; a memory
snapshot from another CPU model or of another size than the instance (qemu
restores a migration stream only into the same machine). A memory snapshot of
an instance with passthrough GPUs or a read-write volume is refused before it
is taken: no VMM saves a GPU's state, and the volume would move on under the
restored guest's feet (the reference's sentences).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Final

from bc.protocol.pb import spec_pb2

META: Final = "meta.json"
DISK: Final = "disk.qcow2"
MEMORY: Final = "memory.state"
MEMBERS: tuple[str, ...] = (META, DISK, MEMORY)
MAX_META_BYTES = 4096

GPU_REFUSAL: Final = "an instance with passthrough GPUs cannot be snapshotted with its memory; snapshot its disk only"
VOLUME_REFUSAL: Final = (
    "an instance with a read-write volume cannot be snapshotted with its memory; snapshot its disk only"
)


class SnapshotError(Exception):
    """A snapshot that cannot be taken or restored: one sentence."""


@dataclass(frozen=True)
class SnapshotMeta:
    runtime: str
    cpu_model: str
    include_memory: bool
    vcpus: int
    memory_mib: int
    disk: bool

    def encode(self) -> bytes:
        doc = {
            "v": 1,
            "runtime": self.runtime,
            "cpu_model": self.cpu_model,
            "include_memory": self.include_memory,
            "vcpus": self.vcpus,
            "memory_mib": self.memory_mib,
            "disk": self.disk,
        }
        return json.dumps(doc, sort_keys=True).encode()


def parse_meta(data: bytes) -> SnapshotMeta:
    """meta.json read back; SnapshotError when it is not one a node wrote."""
    if len(data) > MAX_META_BYTES:
        raise SnapshotError(f"the snapshot's {META} is over {MAX_META_BYTES} bytes")
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise SnapshotError(f"the snapshot's {META} is not JSON") from None
    if not isinstance(doc, dict) or doc.get("v") != 1:
        raise SnapshotError(f"the snapshot's {META} is not version 1")
    strings = {k: doc.get(k) for k in ("runtime", "cpu_model")}
    flags = {k: doc.get(k) for k in ("include_memory", "disk")}
    sizes: dict[str, object] = {k: doc.get(k) for k in ("vcpus", "memory_mib")}
    for k, v in strings.items():
        if not isinstance(v, str) or not v or len(v) > 256:
            raise SnapshotError(f"the snapshot's {META} has no {k}")
    for k, v in flags.items():
        if not isinstance(v, bool):
            raise SnapshotError(f"the snapshot's {META} has no {k} flag")
    counts: dict[str, int] = {}
    for k, v in sizes.items():
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise SnapshotError(f"the snapshot's {META} has no {k}")
        counts[k] = v
    return SnapshotMeta(
        runtime=str(strings["runtime"]),
        cpu_model=str(strings["cpu_model"]),
        include_memory=bool(flags["include_memory"]),
        vcpus=counts["vcpus"],
        memory_mib=counts["memory_mib"],
        disk=bool(flags["disk"]),
    )


def check_member(name: str, is_file: bool, seen: set[str]) -> None:
    """One tar member as a restore reads it: only the three names, regular files, each once, meta.json first."""
    if name not in MEMBERS:
        raise SnapshotError(f"the snapshot holds {name[:80]!r}, which is not one of {', '.join(MEMBERS)}")
    if not is_file:
        raise SnapshotError(f"the snapshot's {name} is not a regular file")
    if name in seen:
        raise SnapshotError(f"the snapshot holds {name} twice")
    if not seen and name != META:
        raise SnapshotError(f"the snapshot does not start with {META}")
    seen.add(name)


def check_members(meta: SnapshotMeta, seen: set[str]) -> None:
    """After the last member: what meta.json promised is there, and nothing it did not."""
    if meta.disk != (DISK in seen):
        raise SnapshotError(f"the snapshot's {META} and its {DISK} disagree")
    if meta.include_memory != (MEMORY in seen):
        raise SnapshotError(f"the snapshot's {META} and its {MEMORY} disagree")


def check_restore(meta: SnapshotMeta, runtime: str, cpu_model: str, vcpus: int, memory_mib: int) -> None:
    """Whether this host's runtime may restore it into an instance of this size: SnapshotError says why not."""
    if meta.runtime != runtime:
        raise SnapshotError(f"the snapshot was taken by runtime {meta.runtime!r}, not {runtime!r}")
    if not meta.include_memory:
        return
    if meta.cpu_model != cpu_model:
        raise SnapshotError(
            f"a memory snapshot restores only on the CPU model it was taken on ({meta.cpu_model!r}), not {cpu_model!r}"
        )
    if (meta.vcpus, meta.memory_mib) != (vcpus, memory_mib):
        raise SnapshotError(
            f"a memory snapshot of {meta.vcpus} vCPUs and {meta.memory_mib} MiB restores only into an instance of"
            f" that size, not {vcpus} vCPUs and {memory_mib} MiB"
        )


def memory_refusal(inst: spec_pb2.Instance) -> str | None:
    """Why a memory snapshot of this instance is refused up front (None: it may be taken)."""
    if inst.gpus:
        return GPU_REFUSAL
    if any(not v.read_only for v in inst.volumes):
        return VOLUME_REFUSAL
    return None
