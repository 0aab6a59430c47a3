"""The qemu runtime's root steps sent to `bc helper` (agent.helper.vm_ops), for an agent that is not root.

`HelperVmm` is agent.instances.qemu's `PrivilegedSteps` seam over the
helper's socket: `vm.launch` (root checks the record, takes the GPUs' groups,
builds qemu's argv and starts it as the VMM's user), `vm.stop` (ends only
that VMM, gives its group nodes back), `vm.unvfio` (the devices back to
their host driver), `vm.taps` / `vm.untaps` (the record's taps, owned by the
VMM's user), `vm.grant-volume` / `vm.revoke-volume` (a live attach's volume
to the VMM's group and back). The request names the instance (and volume) alone. A refusal or failure is a
RuntimeFailure with the helper's sentence.

`HelperNetwork` is the converger's InstanceNetwork under the helper: each pass
writes the network record (`<data>/instance-net.json`, every kept instance's
network fields) and asks `vm.rules`; root builds and loads the ruleset. Its
guard tick asks `vm.rules` with `restore`: root lists the tables, puts back
what changed and says so, and the agent journals `instance.rules-restored`
as it does when it loads the rules itself.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from agent.helper.client import HelperClient, HelperError
from agent.helper.vm_net_rules import NET_RECORD, net_record
from agent.instances.net.guard import GUARD_INTERVAL_S, RESTORED_EVENT, InstanceNetwork
from agent.instances.runtime import RuntimeFailure
from agent.offload import Offload
from bc.protocol.pb import spec_pb2
from bc.runtime.files import atomic_write

log = logging.getLogger(__name__)


class HelperVmm:
    def __init__(self, client: HelperClient) -> None:
        self.client = client

    async def launch(self, instance_id: str, *, paused: bool, user_data: bool, accel: tuple[str, ...]) -> None:
        try:
            await self.client.call(
                "vm.launch", instance_id=instance_id, paused=paused, user_data=user_data, accel=list(accel)
            )
        except HelperError as e:
            text = str(e)
            raise RuntimeFailure(text, capacity="Cannot allocate memory" in text) from None

    async def stop(self, instance_id: str) -> None:
        try:
            await self.client.call("vm.stop", instance_id=instance_id)
        except HelperError as e:
            raise RuntimeFailure(str(e)) from None

    async def unvfio(self, instance_id: str) -> None:
        try:
            await self.client.call("vm.unvfio", instance_id=instance_id)
        except HelperError as e:
            raise RuntimeFailure(str(e)) from None

    async def volume(self, instance_id: str, volume_id: str, *, give: bool) -> None:
        op = "vm.grant-volume" if give else "vm.revoke-volume"
        try:
            await self.client.call(op, instance_id=instance_id, volume_id=volume_id)
        except HelperError as e:
            raise RuntimeFailure(str(e)) from None

    async def taps(self, instance_id: str) -> None:
        try:
            await self.client.call("vm.taps", instance_id=instance_id)
        except HelperError as e:
            raise RuntimeFailure(str(e)) from None

    async def untaps(self, instance_id: str) -> None:
        try:
            await self.client.call("vm.untaps", instance_id=instance_id)
        except HelperError as e:
            raise RuntimeFailure(str(e)) from None


class HelperNetwork(InstanceNetwork):
    def __init__(
        self,
        client: HelperClient,
        data_dir: Path,
        offload: Offload,
        *,
        on_restored: Callable[[dict[str, object]], Awaitable[None]] | None = None,
        interval_s: float = GUARD_INTERVAL_S,
    ) -> None:
        super().__init__(on_restored=on_restored, interval_s=interval_s)
        self.client = client
        self.record = data_dir / NET_RECORD
        self.offload = offload
        self.asked = False
        """Whether root was asked to load rules since this agent started (from then on, every pass asks)."""

    async def apply(self, instances: Sequence[spec_pb2.Instance]) -> str | None:
        if not self.asked and not any(inst.nics for inst in instances):
            return None  # as a root agent: no NIC, nothing loaded, the host's firewall left as it is
        text = json.dumps(net_record(instances), sort_keys=True).encode()
        try:
            await self.offload(atomic_write, self.record, text, 0o600)
        except OSError as e:
            return f"cannot write the network record {self.record}: {e.strerror}"
        self.asked = True
        try:
            got = await self.client.call("vm.rules", restore=False)
        except HelperError as e:
            log.error("event=instance.rules-failed error=%r", str(e))
            return str(e)
        if got.get("loaded"):
            log.info("event=instance.rules-loaded rules=%s through=helper", got.get("rules"))
        return None

    async def check(self) -> bool:
        if not self.asked:
            return False
        try:
            got = await self.client.call("vm.rules", restore=True)
        except HelperError as e:
            log.error("event=instance.rules-restore-failed error=%r", str(e))
            return False
        if not got.get("restored"):
            return False
        drift = [str(t) for t in got.get("tables") or []]
        self.restores += 1
        log.warning("event=%s drift=%r through=helper", RESTORED_EVENT, drift)
        if self.on_restored is not None:
            await self.on_restored({"tables": drift})
        return True
