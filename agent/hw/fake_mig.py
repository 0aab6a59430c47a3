"""The fake hardware's MIG: a layout per GPU that `nvidia-smi` commands change and the inventory shows.

A GPU starts with its profile's layout (`mig_enabled`, `mig_instances`).
`handle(argv)` answers the `nvidia-smi` commands the `mig` host unit issues,
as the real tool would, and changes the layout:

    nvidia-smi -i N -mig 1|0          MIG mode on / off (off refused while GPU instances exist)
    nvidia-smi mig -i N -dci          destroy every compute instance
    nvidia-smi mig -i N -dgi          destroy every GPU instance (refused while compute instances exist)
    nvidia-smi mig -i N -cgi A,B -C   create GPU instances of those profiles, each with one full compute instance

Any other `nvidia-smi` call succeeds and changes nothing. A profile the GPU
does not offer, a layout that does not fit (agent.hw.mig_profiles) or MIG
mode off makes the create fail whole, like the real tool. New GPU instances
take the lowest free ids; their `MIG-…` UUIDs hash the seed, the GPU, the
ids and a creation counter, so a re-created instance gets a new UUID as on a
real GPU. With a state dir the layouts persist in `fake-mig.json` (a fake
agent restart keeps them, as a real one keeps the GPU's).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.hw.base import ProcessResult
from agent.hw.mig_profiles import layout_problem
from bc.protocol.pb import common_pb2
from bc.runtime.files import atomic_write

STATE_FILE = "fake-mig.json"


def mig_uuid(*parts: object) -> str:
    h = hashlib.sha256("\0".join(str(p) for p in parts).encode()).hexdigest()
    return f"MIG-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


@dataclass
class GpuMig:
    enabled: bool
    gis: list[dict[str, Any]] = field(default_factory=list)  # {"gi", "profile", "cis": [ci...], "epoch"}

    def doc(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "gis": self.gis}


class FakeMig:
    def __init__(self, seed: str, profile: str, data: dict[str, Any], state_dir: Path | None = None) -> None:
        self.seed = seed
        self.profile = profile
        self.names = [str(g["name"]) for g in data["gpus"]]
        self.state_path = state_dir / STATE_FILE if state_dir is not None else None
        self.epoch = 0
        self.changes = 0  # bumped by every command that may have changed the layout: what caches key on
        self._lock = threading.Lock()
        self.gpus: dict[int, GpuMig] = {}
        for i, g in enumerate(data["gpus"]):
            gis = [
                {"gi": int(m["gi"]), "profile": str(m["profile"]), "cis": [int(m["ci"])], "epoch": 0}
                for m in g.get("mig_instances", [])
            ]
            self.gpus[i] = GpuMig(bool(g.get("mig_enabled", False)), gis)
        self._load()

    def _load(self) -> None:
        if self.state_path is None:
            return
        try:
            doc = json.loads(self.state_path.read_text("utf-8"))
        except FileNotFoundError:
            return
        self.epoch = int(doc.get("epoch", 0))
        for key, g in doc.get("gpus", {}).items():
            if int(key) in self.gpus:
                self.gpus[int(key)] = GpuMig(bool(g["enabled"]), list(g["gis"]))

    def _save(self) -> None:
        if self.state_path is None:
            return
        doc = {"epoch": self.epoch, "gpus": {str(i): g.doc() for i, g in sorted(self.gpus.items())}}
        atomic_write(self.state_path, (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode())

    def overlay(self, inv: common_pb2.Inventory) -> None:
        """Set each GPU's MIG mode and instances in `inv` from the current layout."""
        with self._lock:
            for gpu in inv.gpus:
                g = self.gpus.get(gpu.index)
                if g is None:
                    continue
                gpu.mig_enabled = g.enabled
                del gpu.mig_instances[:]
                for inst in sorted(g.gis, key=lambda x: int(x["gi"])):
                    for ci in inst["cis"]:
                        parts: list[object] = [self.seed, self.profile, gpu.index, inst["gi"], ci]
                        if inst.get("epoch"):
                            parts.append(inst["epoch"])
                        gpu.mig_instances.add(
                            gi=int(inst["gi"]), ci=int(ci), profile=str(inst["profile"]), uuid=mig_uuid(*parts)
                        )

    def handle(self, argv: Sequence[str]) -> ProcessResult:
        """Answer one `nvidia-smi` command (blocking: the state file)."""
        args = list(argv[1:])
        with self._lock:
            try:
                out = self._handle(args)
            except _ToolError as e:
                return ProcessResult(e.code, b"", (str(e) + "\n").encode())
            self.changes += 1
            self._save()
        return ProcessResult(0, out.encode(), b"")

    def _handle(self, args: list[str]) -> str:
        sub = args[0] == "mig" if args else False
        if sub:
            args = args[1:]
        if not sub and "-mig" not in args:
            return ""  # another query or setting (a compute mode): nothing the layout shows
        index = self._gpu(args)
        if not sub:
            if "-mig" in args:
                on = _value(args, "-mig") == "1"
                g = self.gpus[index]
                if not on and g.gis:
                    raise _ToolError(f"Unable to disable MIG mode on GPU {index}: GPU instances exist")
                g.enabled = on
                return f"{'Enabled' if on else 'Disabled'} MIG Mode for GPU {index}\n"
            return ""
        g = self.gpus[index]
        if not g.enabled:
            raise _ToolError(f"MIG mode is not enabled on GPU {index}", code=6)
        if "-dci" in args:
            for inst in g.gis:
                inst["cis"] = []
            return f"Destroyed compute instances on GPU {index}\n"
        if "-dgi" in args:
            if any(inst["cis"] for inst in g.gis):
                raise _ToolError(f"Unable to destroy GPU instances on GPU {index}: in use by compute instances")
            g.gis = []
            return f"Destroyed GPU instances on GPU {index}\n"
        if "-cgi" in args:
            wanted = [p for p in _value(args, "-cgi").split(",") if p]
            problem = layout_problem(self.names[index], [str(i["profile"]) for i in g.gis] + wanted)
            if problem:
                raise _ToolError(f"Unable to create GPU instances on GPU {index}: {problem}")
            self.epoch += 1
            used = {int(i["gi"]) for i in g.gis}
            lines = []
            for profile in wanted:
                gi = next(n for n in range(1, 64) if n not in used)
                used.add(gi)
                cis = [0] if "-C" in args else []
                g.gis.append({"gi": gi, "profile": profile, "cis": cis, "epoch": self.epoch})
                lines.append(f"Successfully created GPU instance ID {gi} on GPU {index} using profile {profile}")
            return "\n".join(lines) + "\n"
        return ""

    def _gpu(self, args: list[str]) -> int:
        try:
            index = int(_value(args, "-i"))
        except ValueError:
            raise _ToolError("a GPU index (-i N) is required", code=2) from None
        if index not in self.gpus:
            raise _ToolError(f"No GPU with index {index}", code=6)
        return index


class _ToolError(Exception):
    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def _value(args: list[str], flag: str) -> str:
    if flag not in args:
        return ""
    i = args.index(flag)
    return args[i + 1] if i + 1 < len(args) else ""
