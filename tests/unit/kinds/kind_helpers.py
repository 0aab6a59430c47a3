"""Helpers for the command kind tests: a fake node with a state dir, and real CDI holds on it."""

from __future__ import annotations

from pathlib import Path

from google.protobuf import any_pb2
from google.protobuf.message import Message

from agent.converge.devices import DevicesConverger
from agent.hw.fake import FakeHardware
from agent.kinds.base import KindContext
from bc.protocol.pb import spec_pb2


def pack(msg: Message) -> any_pb2.Any:
    a = any_pb2.Any()
    a.Pack(msg)
    return a


class FakeNode:
    """A fake node's context over tmp dirs; `hold()` writes a real CDI hold with the devices converger."""

    def __init__(self, tmp: Path, profile: str = "hgx-h100-8", node_id: str = "node-a") -> None:
        self.data_dir = tmp / "data"
        self.cdi_dir = tmp / "cdi"
        self.hw = FakeHardware(profile, node_id, state_dir=self.data_dir)
        self.inv = self.hw.inventory()
        self.ctx = KindContext(
            node_id=node_id,
            data_dir=self.data_dir,
            hw=self.hw,
            cdi_dir=self.cdi_dir,
            boot_id=self.hw.boot_id(),
        )
        self._converger = DevicesConverger(self.cdi_dir, tmp / "env", self.hw, node_id, mps_pipe_dir=tmp / "mps")
        self._assignments: list[spec_pb2.DeviceAssignment] = []

    def uuid(self, index: int) -> str:
        return self.inv.gpus[index].uuid

    async def hold(self, allocation_id: str, *refs: tuple[str, str]) -> None:
        """Bind one more assignment, exactly as the agent does: the CDI file is then the live hold."""
        self._assignments.append(
            spec_pb2.DeviceAssignment(
                allocation_id=allocation_id,
                reservation_id=f"res-{allocation_id}",
                binding=spec_pb2.BINDING_HOLD,
                devices=[spec_pb2.DeviceRef(device_class=c, atom_id=i) for c, i in refs],
            )
        )
        result = await self._converger.converge(spec_pb2.DevicesSection(assignments=self._assignments), 1)
        assert (self.cdi_dir / f"bc-{allocation_id}.json").is_file(), result

    def resets(self) -> dict[str, int]:
        return FakeHardware.read_resets(self.data_dir)
