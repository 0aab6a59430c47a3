"""What the agent needs from the machine's hardware, whatever provides it.

The agent sees GPUs only through this protocol, so `bc node --fake-hw` can
swap NVML for a seeded fake and nothing else in the agent changes.
"""

from __future__ import annotations

import hashlib
from typing import Protocol

from bc.protocol.canonical import canonical_json, message_to_dict
from bc.protocol.pb import common_pb2

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


class HardwareBackend(Protocol):
    def inventory(self) -> common_pb2.Inventory:
        """The node's GPUs (and host basics) as they are now; may block (NVML), so call it off the loop."""
        ...

    def boot_id(self) -> str:
        """The kernel's boot id: it changes exactly when the machine reboots."""
        ...

    def describe(self) -> str:
        """One line for logs and `bc node` start-up: which backend, how many GPUs."""
        ...


def inventory_hash(inv: common_pb2.Inventory) -> str:
    """`sha256:<hex>` of the inventory's canonical JSON.

    Canonical JSON rather than protobuf bytes, so the hash is the same for
    the same inventory on every protobuf version and both ends of the wire.
    """
    return "sha256:" + hashlib.sha256(canonical_json(message_to_dict(inv)).encode()).hexdigest()


def read_boot_id(path: str = BOOT_ID_PATH) -> str:
    """The kernel boot id, or "unknown" where the kernel does not offer one (not Linux)."""
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip() or "unknown"
    except OSError:
        return "unknown"
