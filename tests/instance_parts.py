"""What the instances tests build again and again: a small instance's spec, and the secret port as the
converger sees it (the broker itself is tested on a real control plane in
tests/integration/test_instances_user_data.py)."""

from __future__ import annotations

from typing import Any

from agent.converge.secret_port import SecretUnavailable
from bc.protocol.pb import spec_pb2

GUEST_CMDLINE = "console=ttyS0 quiet panic=-1"
"""The real guests' kernel command line: the console on the serial port (the test reads it), a panic ends it."""


def instance(iid: str, **fields: Any) -> spec_pb2.Instance:
    """A small qemu instance: 1 vCPU, 256 MiB, the boot directory's `vmlinuz`; `fields` add to these or
    replace them."""
    return spec_pb2.Instance(
        **{"id": iid, "runtime": "qemu", "vcpus": 1, "memory_mib": 256, "kernel": "vmlinuz", **fields}
    )


def guest(iid: str, **fields: Any) -> spec_pb2.Instance:
    """`instance` booting a real guest (tests/qemu_guest.py): its `initrd`, its console on the serial port."""
    return instance(iid, **{"initrd": "initrd", "cmdline": GUEST_CMDLINE, **fields})


class SecretPort:
    """The secret port: values by name, or an exception to raise; a name with no value is not answered yet
    (SecretUnavailable), as a broker that has not decided."""

    def __init__(self) -> None:
        self.values: dict[str, bytes | Exception] = {}

    async def get(self, name: str, section: str, generation: int, unit: str = "", allocation_id: str = "") -> bytes:
        value = self.values.get(name, SecretUnavailable("no answer"))
        if isinstance(value, Exception):
            raise value
        return value

    def release(self, section: str, unit: str = "") -> None:
        pass
