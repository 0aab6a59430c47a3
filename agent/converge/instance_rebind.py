"""Identity rebind after a memory restore, off the converge pass (docs/instances.md, "Identity rebind").

Once a memory-restored instance that names `identity_rebind_ref` runs, the
converger calls `consider`; at most one try per instance runs at a time, in
its own task:

1. fetch the bundle from the broker, bound to the instances section (and the
   instance's allocation), as user data is fetched, and check it
   (`rebind.parse_bundle`);
2. write the raw 1 MiB disk (`rebind.image`, 0600, in the instance's
   directory), hot-add it with serial `bc-rebind`, and wait up to `answer_s`
   (2 minutes) for `BCREBOUND <nonce>` at the start of its last 4 KiB;
3. detach it, zero it and delete it, whatever happened: the secret never stays
   on the host;
4. on an answer, record the ref in `<data-dir>/instances-rebound.json` (the
   converger reports it as `InstanceStatus.identity_rebound_ref`) and wake
   the converger.

A guest that does not answer is tried at most `max_tries` (3) times per ref,
`retry_s` (5 minutes) apart; a bundle the broker refuses, or a malformed one,
is not tried again. A broker that cannot answer now is asked again on a later
pass, not counted. Nothing is reported until the guest answers: fail closed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agent.converge.secret_port import SecretRefused, SecretSource, SecretUnavailable
from agent.instances import rebind
from agent.instances.runtime import RuntimeFailure
from agent.instances.snapshots import SnapshotRuntime
from agent.offload import Offload
from bc.runtime.aio import cancel_and_wait
from bc.runtime.files import atomic_write
from bc.seams.clock import Clock

log = logging.getLogger(__name__)

IMAGE = "rebind.img"
SECTION = "instances"


@dataclass
class _Tries:
    count: int = 0
    last: float = float("-inf")
    given_up: bool = False


class Rebinder:
    def __init__(
        self,
        record: Path,
        runtime: SnapshotRuntime,
        secrets_source: SecretSource | None,
        offload: Offload,
        clock: Clock,
        *,
        rng: random.Random,
        answer_s: float = 120.0,
        poll_s: float = 0.5,
        retry_s: float = 300.0,
        max_tries: int = 3,
        wake: Callable[[], None] = lambda: None,
    ) -> None:
        self.record = record
        self.runtime = runtime
        self.secrets = secrets_source
        self.offload = offload
        self.clock = clock
        self.rng = rng
        self.answer_s, self.poll_s, self.retry_s, self.max_tries = answer_s, poll_s, retry_s, max_tries
        self.wake = wake
        self._rebound: dict[str, str] | None = None
        self._tries: dict[tuple[str, str], _Tries] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}

    async def rebound(self) -> dict[str, str]:
        """Instance id -> the ref its running guest took (read from the record once)."""
        if self._rebound is None:
            try:
                doc = json.loads(await self.offload(self.record.read_bytes))
                self._rebound = {str(k): str(v) for k, v in doc.items()} if isinstance(doc, dict) else {}
            except (OSError, ValueError):
                self._rebound = {}
        return self._rebound

    async def _save(self) -> None:
        data = json.dumps(await self.rebound(), sort_keys=True).encode()
        await self.offload(atomic_write, self.record, data, 0o600)

    async def prune(self, keep: set[str]) -> None:
        """Forget instances no spec names any more."""
        rebound = await self.rebound()
        gone = [k for k in rebound if k not in keep]
        for k in gone:
            del rebound[k]
        self._tries = {k: v for k, v in self._tries.items() if k[0] in keep}
        if gone:
            await self._save()

    def tries(self, instance_id: str, ref: str) -> int:
        return self._tries.get((instance_id, ref), _Tries()).count

    async def consider(self, instance_id: str, ref: str, allocation_id: str, generation: int) -> None:
        """The instance runs, memory-restored, naming `ref`: start a try unless it took it, one runs, or the
        tries are spent or too recent."""
        if (await self.rebound()).get(instance_id) == ref or instance_id in self._tasks:
            return
        tries = self._tries.setdefault((instance_id, ref), _Tries())
        if tries.given_up or tries.count >= self.max_tries or self.clock.monotonic() < tries.last + self.retry_s:
            return
        self._tasks[instance_id] = asyncio.create_task(
            self._run(instance_id, ref, allocation_id, generation, tries), name=f"rebind-{instance_id}"
        )

    async def _run(self, instance_id: str, ref: str, allocation_id: str, generation: int, tries: _Tries) -> None:
        try:
            if self.secrets is None:
                tries.given_up = True
                log.warning("event=instance.rebind-refused instance=%s reason=no secret broker", instance_id)
                return
            try:
                raw = await self.secrets.get(ref, SECTION, generation, allocation_id=allocation_id)
                bundle = rebind.parse_bundle(raw)
            except SecretUnavailable:
                return  # not now: a later pass asks again, and it is not a try
            except (SecretRefused, rebind.RebindError) as e:
                tries.given_up = True
                log.warning("event=instance.rebind-refused instance=%s ref=%s error=%r", instance_id, ref, str(e))
                return
            tries.count += 1
            tries.last = self.clock.monotonic()
            nonce = f"{self.rng.getrandbits(128):032x}"  # matches the guest's answer to this hand-over
            if await self._hand_over(instance_id, bundle, nonce):
                (await self.rebound())[instance_id] = ref
                await self._save()
                log.info("event=instance.rebound instance=%s ref=%s try=%d", instance_id, ref, tries.count)
                self.wake()
            else:
                log.warning("event=instance.rebind-unanswered instance=%s ref=%s try=%d", instance_id, ref, tries.count)
        finally:
            self._tasks.pop(instance_id, None)

    async def _hand_over(self, instance_id: str, bundle: rebind.RebindBundle, nonce: str) -> bool:
        image = self.runtime.instance_dir(instance_id) / IMAGE
        try:
            await self.offload(atomic_write, image, rebind.image(bundle, nonce), 0o600)
            attached = False
            try:
                await self.runtime.attach_rebind(instance_id, image)
                attached = True
                return await self._answered(image, nonce)
            except RuntimeFailure as e:
                log.warning("event=instance.rebind-failed instance=%s error=%r", instance_id, str(e))
                return False
            finally:
                if attached:
                    try:
                        await self.runtime.detach_rebind(instance_id)
                    except RuntimeFailure as e:
                        log.warning("event=instance.rebind-detach instance=%s error=%r", instance_id, str(e))
        finally:
            await self.offload(_zero_and_remove, image)

    async def _answered(self, image: Path, nonce: str) -> bool:
        """Wait up to `answer_s` for the guest's line: the file is re-read every `poll_s` (a guest's write through
        qemu raises no event the host can wait on)."""
        try:
            async with asyncio.timeout(self.answer_s):
                while True:
                    if rebind.acknowledged(await self.offload(_answer_block, image), nonce):
                        return True
                    await asyncio.sleep(self.poll_s)
        except TimeoutError:
            return False

    async def close(self) -> None:
        await cancel_and_wait(list(self._tasks.values()))


def _answer_block(image: Path) -> bytes:
    with image.open("rb") as f:
        f.seek(rebind.IMAGE_BYTES - rebind.ANSWER_BYTES)
        return f.read(rebind.ANSWER_BYTES)


def _zero_and_remove(image: Path) -> None:
    """Overwrite the disk with zeros (its tar holds a host key) and delete it."""
    try:
        with image.open("r+b") as f:
            f.write(b"\0" * rebind.IMAGE_BYTES)
            f.flush()
            import os

            os.fsync(f.fileno())
    except FileNotFoundError:
        return
    image.unlink(missing_ok=True)
