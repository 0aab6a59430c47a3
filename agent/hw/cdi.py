"""CDI spec files for device holds: render, validate, write atomically, read back.

A hold is one CDI spec file per allocation, `bc-<allocation id>.json`, in the
CDI directory (`/etc/cdi`). Container runtimes read it to inject the devices,
and the devices converger reads it back on every pass: the files, not the
agent's memory, say what the node holds, so a restart or a crash between two
writes never loses or invents a hold. Each device's CDI name is its atom id
with `/` as `_`; the real id rides in the device annotation
`bc.dev/device-id`. Every document is checked against the CDI JSON schema
(bundled in `cdi_schema/`, Apache-2.0) and the CDI name rules before it is
written, so a runtime never meets a spec it rejects.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from jsonschema import Draft7Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

from agent.hw.dev_nodes import DevNode
from agent.hw.limits import Limits
from bc.protocol.atoms import CDI_KIND, Atom, cdi_name, infer_atom
from bc.runtime import files
from bc.runtime.files import fsync_dir

log = logging.getLogger(__name__)

CDI_VERSION = "0.6.0"
ANN_DEVICE_ID = "bc.dev/device-id"
ANN_ALLOCATION_ID = "bc.dev/allocation-id"
ANN_RESERVATION_ID = "bc.dev/reservation-id"
ANN_BINDING = "bc.dev/binding"
ANN_CGROUP_PARENT = "bc.dev/cgroup-parent"
ANN_LIMITS = "bc.dev/limits"
BINDING_KUBERNETES = "kubernetes"

ENV_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
ENV_ALLOCATION_ID = "BC_ALLOCATION_ID"
ENV_MPS_PIPE = "CUDA_MPS_PIPE_DIRECTORY"
ENV_CGROUP_PARENT = "BC_CGROUP_PARENT"
RESERVED_ENV = frozenset({ENV_VISIBLE_DEVICES, ENV_ALLOCATION_ID, ENV_MPS_PIPE, ENV_CGROUP_PARENT})
"""Keys the agent sets itself; an assignment's extra env may not override them."""

SPEC_PREFIX = "bc-"
SPEC_SUFFIX = ".json"
TMP_PREFIX = files.TMP_PREFIX

_ALLOCATION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")
_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?")
_VENDOR = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?")
_CLASS = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?")


class CdiError(ValueError):
    """A CDI document the agent would write does not validate (a bug, never the operator's input)."""


@dataclass(frozen=True)
class ResolvedDevice:
    """An atom resolved against the live inventory: what the driver calls it, and its GPU's index."""

    atom: Atom
    visible_id: str  # the MIG-… UUID for a MIG instance, else the GPU UUID
    gpu_index: int
    nodes: tuple[DevNode, ...] = ()
    """The device's own nodes (its GPU's, and a MIG instance's cap nodes); empty: `/dev/nvidia<index>` by path."""


@dataclass(frozen=True)
class HeldSpec:
    """A hold read back from the CDI directory."""

    allocation_id: str
    reservation_id: str
    kubernetes: bool
    atoms: tuple[Atom, ...]
    doc: dict[str, Any]
    path: Path
    limits: Limits | None = None
    """What the hold booked (annotation `bc.dev/limits`), None without limits."""
    cgroup_parent: str = ""
    """The hold's slice (annotation `bc.dev/cgroup-parent`), empty without one."""
    instance: bool = False
    """A `BINDING_INSTANCE` booking (agent.instances.bookings), not a CDI file: GPUs for a VM."""


def valid_allocation_id(allocation_id: str) -> bool:
    """Allocation ids become file names, so only a safe alphabet (no `/`, no leading dot)."""
    return _ALLOCATION_ID.fullmatch(allocation_id) is not None


def check_env_line(line: str) -> str | None:
    """Why an extra env line is refused, or None: KEY=VALUE, no line breaks, no reserved key."""
    key, sep, value = line.partition("=")
    if not sep or not _ENV_KEY.fullmatch(key):
        return f"env line {line!r} is not KEY=VALUE"
    if any(c in value for c in "\n\r\0"):
        return f"env {key} has a line break or NUL in its value"
    if key in RESERVED_ENV:
        return f"env {key} is set by the agent and cannot be overridden"
    return None


def spec_path(cdi_dir: Path, allocation_id: str) -> Path:
    return cdi_dir / f"{SPEC_PREFIX}{allocation_id}{SPEC_SUFFIX}"


def env_lines(
    allocation_id: str,
    devices: Sequence[ResolvedDevice],
    *,
    kubernetes: bool,
    extra_env: Sequence[str] = (),
    mps_pipe_dir: str | None = None,
    cgroup_parent: str = "",
) -> list[str]:
    """The hold's environment: what the driver should see (a GPU once, however many slots), who we are.

    A Kubernetes hold gets no NVIDIA_VISIBLE_DEVICES: the kubelet's device
    plugin hands a pod part of it and sets its own. A hold with a slice names
    it in BC_CGROUP_PARENT, where containerd, Slurm or a wrapper places the
    workload (the agent never moves processes).
    """
    lines: list[str] = []
    if not kubernetes:
        visible: list[str] = []
        for d in devices:
            if d.visible_id not in visible:
                visible.append(d.visible_id)
        lines.append(f"{ENV_VISIBLE_DEVICES}={','.join(visible)}")
    lines.append(f"{ENV_ALLOCATION_ID}={allocation_id}")
    if cgroup_parent:
        lines.append(f"{ENV_CGROUP_PARENT}={cgroup_parent}")
    if mps_pipe_dir and any(d.atom.device_class == "gpu.slot" for d in devices):
        lines.append(f"{ENV_MPS_PIPE}={mps_pipe_dir}")
    lines.extend(extra_env)
    return lines


def render_spec(
    allocation_id: str,
    reservation_id: str,
    devices: Sequence[ResolvedDevice],
    env: Sequence[str],
    *,
    kubernetes: bool,
    limits: Limits | None = None,
    cgroup_parent: str = "",
    control_nodes: Sequence[DevNode] = (),
) -> dict[str, Any]:
    """The CDI document of a hold: one device per atom, the env and the driver's control nodes at spec level.

    Devices carry no env of their own; each names its GPU's device node (and a
    MIG instance its capability nodes), since CDI runtimes refuse a device with
    no edits at all. `control_nodes` (`/dev/nvidiactl`, `/dev/nvidia-uvm`, …,
    agent.hw.dev_nodes) are what CUDA opens besides the GPU, so a runtime with
    CDI and no NVIDIA hook gives the workload all it needs. A hold with limits
    carries them in `bc.dev/limits` (host admission reads them back) and its
    slice in `bc.dev/cgroup-parent`.
    """
    annotations = {ANN_ALLOCATION_ID: allocation_id, ANN_RESERVATION_ID: reservation_id}
    if kubernetes:
        annotations[ANN_BINDING] = BINDING_KUBERNETES
    if limits is not None and not limits.empty:
        annotations[ANN_LIMITS] = limits.annotation()
    if cgroup_parent:
        annotations[ANN_CGROUP_PARENT] = cgroup_parent
    edits: dict[str, Any] = {"env": list(env)}
    if control_nodes:
        edits["deviceNodes"] = [node_doc(n) for n in control_nodes]
    return {
        "cdiVersion": CDI_VERSION,
        "kind": CDI_KIND,
        "annotations": annotations,
        "devices": [
            {
                "name": cdi_name(d.atom.atom_id),
                "annotations": {ANN_DEVICE_ID: d.atom.atom_id},
                "containerEdits": {
                    "deviceNodes": [node_doc(n) for n in d.nodes] or [{"path": f"/dev/nvidia{d.gpu_index}"}]
                },
            }
            for d in devices
        ],
        "containerEdits": edits,
    }


def node_doc(n: DevNode) -> dict[str, Any]:
    """A CDI deviceNode with its type and numbers, so a runtime can make it without the host's node."""
    return {"path": n.path, "type": n.type, "major": n.major, "minor": n.minor}


@cache
def _validator() -> Any:
    folder = resources.files(__package__ or "agent.hw").joinpath("cdi_schema")
    schema = json.loads(folder.joinpath("schema.json").read_text("utf-8"))
    defs = json.loads(folder.joinpath("defs.json").read_text("utf-8"))
    registry: Registry[Any] = Registry().with_resource(
        "defs.json", Resource.from_contents(defs, default_specification=DRAFT7)
    )
    return Draft7Validator(schema, registry=registry)


def validate_spec(doc: dict[str, Any]) -> None:
    """Raise CdiError unless the document passes the CDI schema and the CDI name rules.

    A document that passed is remembered by its canonical JSON: the drift pass renders every hold's spec
    again every 10 s, and the schema walk costs far more than the encoding."""
    _validate_canonical(json.dumps(doc, sort_keys=True, separators=(",", ":")))


@lru_cache(maxsize=4096)
def _validate_canonical(text: str) -> None:
    """Raises for a bad document; lru_cache keeps only the ones that passed (a raise is not cached)."""
    _validate_doc(json.loads(text))


def _validate_doc(doc: dict[str, Any]) -> None:
    errors = sorted(_validator().iter_errors(doc), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        where = "/".join(str(p) for p in e.absolute_path) or "(root)"
        raise CdiError(f"CDI spec fails the schema at {where}: {e.message}")
    kind = doc["kind"]
    vendor, slash, cls = kind.partition("/")
    if not slash or "/" in cls or not _VENDOR.fullmatch(vendor) or not _CLASS.fullmatch(cls):
        raise CdiError(f"CDI kind {kind!r} is not vendor.domain/class")
    names = [d["name"] for d in doc["devices"]]
    for name in names:
        if not _NAME.fullmatch(name):
            raise CdiError(f"CDI device name {name!r} breaks the CDI name rules")
    if len(set(names)) != len(names):
        raise CdiError("CDI device names repeat")


def entries(directory: Path, prefix: str, suffix: str = "", *, regular_only: bool = False) -> list[Path]:
    """The entries of `directory` named `prefix`*`suffix`, sorted; none when it is missing. Blocking.

    One `os.scandir` (the drift pass lists its directories every 10 s on every node; pathlib's glob costs
    several times as much). `regular_only` keeps regular files that are not symlinks."""
    try:
        with os.scandir(directory) as it:
            names = [
                e.name
                for e in it
                if e.name.startswith(prefix)
                and e.name.endswith(suffix)
                and len(e.name) >= len(prefix) + len(suffix)
                and (not regular_only or e.is_file(follow_symlinks=False))
            ]
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [directory / n for n in sorted(names)]


def read_holds(cdi_dir: Path) -> dict[str, HeldSpec]:
    """Every hold in the CDI directory, by allocation id (files that are not ours are ignored)."""
    holds: dict[str, HeldSpec] = {}
    for path in entries(cdi_dir, SPEC_PREFIX, SPEC_SUFFIX):
        try:
            held = _parse_hold(path)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            log.warning("event=cdi.unreadable path=%s error=%r", path, str(e))
            continue
        holds[held.allocation_id] = held
    return holds


def _parse_hold(path: Path) -> HeldSpec:
    doc = json.loads(path.read_text("utf-8"))
    if not isinstance(doc, dict) or doc.get("kind") != CDI_KIND:
        raise ValueError("not a bc.dev/gpu CDI spec")
    annotations = doc.get("annotations") or {}
    stem = path.name[len(SPEC_PREFIX) : -len(SPEC_SUFFIX)]
    allocation_id = str(annotations.get(ANN_ALLOCATION_ID, stem))
    if allocation_id != stem:
        raise ValueError(f"the file names allocation {stem!r} but its annotation says {allocation_id!r}")
    atoms = tuple(infer_atom(str(d["annotations"][ANN_DEVICE_ID])) for d in doc["devices"])
    limits: Limits | None = None
    if ANN_LIMITS in annotations:
        try:
            limits = Limits.from_annotation(str(annotations[ANN_LIMITS]))
        except (ValueError, TypeError) as e:  # the hold stands; only its booked limits are unknown
            log.warning("event=cdi.bad_limits path=%s error=%r", path, str(e))
    return HeldSpec(
        allocation_id=allocation_id,
        reservation_id=str(annotations.get(ANN_RESERVATION_ID, "")),
        kubernetes=annotations.get(ANN_BINDING) == BINDING_KUBERNETES,
        atoms=atoms,
        doc=doc,
        path=path,
        limits=limits,
        cgroup_parent=str(annotations.get(ANN_CGROUP_PARENT, "")),
    )


def spec_bytes(doc: dict[str, Any]) -> bytes:
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()


def atomic_write(path: Path, data: bytes, mode: int = 0o644) -> None:
    """A spec, env or host file whole or not at all (bc.runtime.files.atomic_write); a directory it makes is 0755,
    for the container runtime and the host's tools to read."""
    files.atomic_write(path, data, mode, dir_mode=0o755)


def remove_file(path: Path) -> bool:
    """Remove a file and make the removal durable; False when it was already gone."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    fsync_dir(path.parent)
    return True


def remove_stale_temps(directory: Path) -> None:
    """Temp files a crash left behind mid-write (ours only: they carry our prefix)."""
    for tmp in entries(directory, TMP_PREFIX):
        try:
            tmp.unlink()
        except OSError:
            pass
