"""What every command kind executor is: parse the payload, name its locks, run.

The dispatcher (journal, lanes, per-resource locks, reports) is generic; all
it needs from a kind is this small protocol. Parsing is separate from
running so a bad payload is refused `invalid-payload` before any lock is
taken or side effect started, and `resources` is separate so the dispatcher
can take the per-resource locks (one GPU, one disk, one allocation) that
keep two lanes off the same device. `run` reports outcomes as a KindResult
rather than raising: a GPU that failed to reset is a result, not a crash.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from google.protobuf import any_pb2
from google.protobuf.message import DecodeError, Message

from agent.hw.base import HardwareBackend
from agent.kind_result import KindResult as KindResult  # the kinds' own name for it
from agent.kinds.upload_allow import UrlParts
from agent.offload import Offload, to_thread
from agent.ramdisk.kexec import Kexec
from agent.ramdisk.machine import MachineTree
from bc.protocol.atoms import GPU, parse_atom
from bc.seams.clock import Clock, SystemClock

log = logging.getLogger(__name__)

INVALID_PAYLOAD = "invalid-payload"
GPU_BUSY = "gpu-busy"
DCGM_NOT_INSTALLED = "dcgm-not-installed"
INTERNAL = "internal"

ALL_GPUS = "gpu:*"
"""The lock of a kind that touches every GPU (a reboot, DCGM over all GPUs): it conflicts with every `gpu:<uuid>`."""


def gpu_lock(uuid: str) -> str:
    return f"gpu:{uuid}"


class InvalidPayload(Exception):
    """The payload is not this kind's request, or its fields are invalid: the command fails `invalid-payload`."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass
class KindContext:
    """What a kind may use on this node. Real hardware acts only when the config allows it; a fake always may."""

    node_id: str
    data_dir: Path
    hw: HardwareBackend
    cdi_dir: Path
    boot_id: str
    allow_gpu_reset: bool = False
    allow_reboot: bool = False
    log_paths: list[Path] = field(default_factory=list)
    """The files (or directories) `logs.collect` bundles."""
    journal_summary: Callable[[], Awaitable[dict[str, Any]]] | None = None
    """Gives `logs.collect` the journal's summary for `journal-summary.json`."""
    upload_allow: tuple[UrlParts, ...] = ()
    """Where `logs.collect` may upload (`bc node --upload-allow`); empty: nowhere, the tarball stays here."""
    clock: Clock = field(default_factory=SystemClock)
    """The agent's clock: what a kind stamps (a tarball's name and mtime) comes from it, never from the host."""
    offload: Offload = to_thread
    """Where a kind's blocking calls run (agent.offload): a thread in production, inline under the simulator."""
    after_gpu_reset: Callable[[Sequence[str]], Awaitable[dict[str, bool]]] | None = None
    """The health monitor's read after a reset (agent.health.monitor): healthy per GPU; clears the XIDs of those."""
    command_id: str = ""
    """The command being run (the dispatcher sets it per run): a self-update records it in upgrade.json."""
    upgrader: Any = None
    """The self-update controller (agent.upgrade.controller.Upgrader); None when there is no A/B slot."""
    machine: MachineTree | None = None
    """A ramdisk's disks (agent.ramdisk.machine): disk.wipe, deploy.image and boot.kexec act on them; None on a
    node, whose dispatcher never runs those kinds (their roles are `ramdisk` only)."""
    kexec: Kexec | None = None
    """A ramdisk's kexec edge (agent.ramdisk.kexec)."""
    gone: Callable[[], None] = lambda: None
    """What a ramdisk's kexec ends: the agent (it stops)."""
    ca_pem: bytes = b""
    """The cluster CA, which deploy.image trusts beside the system's roots for an https image URL."""
    snapshots: Any = None
    """The node's snapshots (agent.instances.snapshots.Snapshots), which instance.snapshot takes; None: no runtime."""
    spec_instances: Callable[[], Sequence[Any]] = lambda: ()
    """The instances of the spec the node enforces (instance.snapshot refuses a memory snapshot by them)."""


class KindExecutor(Protocol):
    name: str

    def parse(self, payload: any_pb2.Any) -> Message:
        """The kind's request message; raises InvalidPayload. An empty Any (no type_url) is the default request."""
        ...

    def resources(self, request: Message) -> list[str]:
        """The per-resource locks the command needs (`gpu:<uuid>`, `disk:…`, `alloc:…`); empty for none."""
        ...

    async def run(self, ctx: KindContext, request: Message) -> KindResult:
        """Do the work. Never raises but for cancellation: an unexpected error is reported `internal`."""
        ...


RequestT = TypeVar("RequestT", bound=Message)


def unpack(payload: any_pb2.Any, cls: type[RequestT]) -> RequestT:
    """The request in an Any; an empty Any (no type_url, no bytes) is the default request."""
    msg = cls()
    if not payload.type_url:
        if payload.value:
            raise InvalidPayload("the payload has bytes but no type_url")
        return msg
    if payload.TypeName() != cls.DESCRIPTOR.full_name:
        raise InvalidPayload(f"the payload is {payload.TypeName()!r}, expected {cls.DESCRIPTOR.full_name!r}")
    try:
        payload.Unpack(msg)
    except DecodeError as e:
        raise InvalidPayload(f"the payload does not decode as {cls.DESCRIPTOR.full_name}: {e}") from None
    return msg


def check_gpu_uuids(uuids: Iterable[str]) -> list[str]:
    """The UUIDs in order without repeats; InvalidPayload for one that is not a GPU UUID's shape.

    UUIDs end up as arguments to vendor tools, so one that starts with `-`
    or holds a space must never get that far.
    """
    out: list[str] = []
    for u in uuids:
        try:
            parse_atom(GPU, u)
        except ValueError:
            raise InvalidPayload(f"{u!r} is not a GPU UUID") from None
        if u not in out:
            out.append(u)
    return out


class TypedExecutor(abc.ABC, Generic[RequestT]):
    """The shared half of an executor over one request message: parse, type check, error capture."""

    name: str
    request_type: type[RequestT]

    def parse(self, payload: any_pb2.Any) -> RequestT:
        request = unpack(payload, self.request_type)
        self.validate(request)
        return request

    def validate(self, request: RequestT) -> None:
        """Raise InvalidPayload for fields the kind refuses; none by default."""

    def resources(self, request: Message) -> list[str]:
        return self.locks(self._typed(request))

    def locks(self, request: RequestT) -> list[str]:
        return []

    async def run(self, ctx: KindContext, request: Message) -> KindResult:
        try:
            typed = self._typed(request)
            self.validate(typed)
            return await self.execute(ctx, typed)
        except InvalidPayload as e:
            return KindResult.failure(INVALID_PAYLOAD, e.message)
        except Exception as e:
            log.exception("event=command.internal_error kind=%s", self.name)
            return KindResult.failure(INTERNAL, f"{type(e).__name__}: {e}")

    @abc.abstractmethod
    async def execute(self, ctx: KindContext, request: RequestT) -> KindResult:
        """The kind's side effect, on a request already checked by `validate`."""

    def _typed(self, request: Message) -> RequestT:
        if not isinstance(request, self.request_type):
            raise InvalidPayload(f"{self.name} takes a {self.request_type.DESCRIPTOR.full_name}")
        return request
