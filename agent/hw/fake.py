"""Seeded fake GPUs, so a laptop or the simulator can run `bc node` as a GPU host.

A profile (`profiles/<name>.json`) says what GPUs a machine has; the seed
(normally the node id) makes their UUIDs. UUIDs come from a hash of seed,
profile and index, so a node sees the same GPUs on every start (its holds in
/etc/cdi still resolve after a restart) and two nodes never share a UUID.
Host facts (hostname, CPUs, memory) come from the profile and seed too, so
the inventory and its hash depend on nothing but (profile, seed), which the
simulator needs to replay a run. Only GPUs are faked: `boot_id` is the real
kernel's.
"""

from __future__ import annotations

import hashlib
import json
from importlib import resources
from typing import Any

from agent.hw.base import read_boot_id
from bc.protocol.pb import common_pb2

_PROFILES = "profiles"


def _uuid(prefix: str, *parts: object) -> str:
    """`<prefix>-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` from a hash of the parts."""
    h = hashlib.sha256("\0".join(str(p) for p in parts).encode()).hexdigest()
    return f"{prefix}-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _load_profile(name: str) -> dict[str, Any]:
    known = FakeHardware.profiles()
    if name not in known:
        raise ValueError(f"unknown fake hardware profile {name!r}; profiles are {', '.join(known)}")
    text = resources.files(__package__ or "agent.hw").joinpath(_PROFILES, f"{name}.json").read_text("utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


class FakeHardware:
    """A HardwareBackend whose GPUs come from a profile and a seed."""

    def __init__(self, profile: str, seed: str) -> None:
        self.profile = profile
        self.seed = seed
        self._inventory = self._build(_load_profile(profile))

    @staticmethod
    def profiles() -> list[str]:
        """The names of the bundled profiles, sorted."""
        folder = resources.files(__package__ or "agent.hw").joinpath(_PROFILES)
        return sorted(p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json"))

    def _build(self, data: dict[str, Any]) -> common_pb2.Inventory:
        inv = common_pb2.Inventory(
            hostname=self.seed,
            source=f"fake:{self.profile}",
            driver_version=str(data.get("driver_version", "")),
            cpus=int(data.get("cpus", 0)),
            memory_bytes=int(data.get("memory_gib", 0)) * (1 << 30),
        )
        for index, g in enumerate(data["gpus"]):
            gpu_uuid = _uuid("GPU", self.seed, self.profile, index)
            gpu = inv.gpus.add(
                index=index,
                uuid=gpu_uuid,
                name=str(g["name"]),
                pci_bus_id=str(g.get("pci_bus_id", f"00000000:{0x18 + 0x10 * index:02X}:00.0")),
                memory_mib=int(g["memory_mib"]),
                mig_enabled=bool(g.get("mig_enabled", False)),
                slots=int(g.get("slots", 0)),
                healthy=bool(g.get("healthy", True)),
            )
            for m in g.get("mig_instances", []):
                gi, ci = int(m["gi"]), int(m["ci"])
                gpu.mig_instances.add(
                    gi=gi,
                    ci=ci,
                    profile=str(m["profile"]),
                    uuid=_uuid("MIG", self.seed, self.profile, index, gi, ci),
                )
        return inv

    def inventory(self) -> common_pb2.Inventory:
        """A copy of the fake inventory (callers may change theirs freely)."""
        inv = common_pb2.Inventory()
        inv.CopyFrom(self._inventory)
        return inv

    def boot_id(self) -> str:
        return read_boot_id()

    def describe(self) -> str:
        return f"fake:{self.profile} ({len(self._inventory.gpus)} GPUs, seed {self.seed})"
