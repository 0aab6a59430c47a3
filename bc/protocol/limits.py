"""The one table of sizes: every place data enters has a limit, and both ends read it from here.

gRPC refuses a frame over its receive limit before any handler sees it, and a
refused frame is invisible to the code that could have explained it. So every
writer checks these limits *before* it stores or sends, and the gRPC limits on
every channel are derived from the same table:

==================  =========  ============================================  ==================================
Limit               Bytes      What it bounds                                Enforced
==================  =========  ============================================  ==================================
max_payload_bytes   1,048,576  a command's payload (encoded, and its JSON)   Admin RunCommand and batches,
                                                                             before the transaction: exit 2
max_result_bytes    1,048,576  a command's result                            the agent, before it journals and
                                                                             signs: FAILED `result-too-large`;
                                                                             the gateway acks a bigger one as
                                                                             refused
max_text_bytes      4,096      a reason or message (UTF-8) in an update      cut to fit, never refused
max_section_bytes   262,144    one spec section (encoded, and its JSON)      Admin SetSpecSection: exit 2
max_spec_bytes      1,048,576  a whole spec (the encoded DesiredStateBody,   every spec write, before anything
                               and the canonical JSON)                       is stored: exit 2
max_event_bytes     65,536     one node event                                the agent journals `event.too-large`
                                                                             instead; the gateway acks a bigger
                                                                             one as refused
max_batch_nodes     10,000     the nodes of one destructive batch            Admin CreateBatch: exit 2
max_enqueue_cmds    10,000     the commands of one EnqueueCommands call      Admin EnqueueCommands: exit 2,
                                                                             nothing stored
max_frame_bytes     4,128,768  any one frame written on a session            Hello carries unacked results up to
                                                                             it; event batches are split to it
grpc_message_bytes  4,194,304  gRPC's receive and send limit on every        max_frame_bytes + 64 KiB headroom,
                               channel (agent, gateway, Admin both ends)     which is gRPC's own default: an
                                                                             older peer accepts every frame
max_status_bytes    1,024      the details of an error status (they travel   every Admin error, cut to fit: an
                               in gRPC's trailing metadata, percent-encoded  echoed argument never makes exit 5
                               up to 3x; gRPC's metadata limit is 8 KiB)
max_local_file      16 MiB     a local file the CLI reads (@file payloads,   the CLI, before reading: exit 2;
                               operator configs, keys and certificates)      a FIFO or device is exit 2 at once
==================  =========  ============================================  ==================================

Numbers, times and names (issue 29): every integer, duration and time is bounded where the CLI parses it
and again where the Admin API takes it, from the same fields (`check_range`, `check_name`):

=====================  ================  ============================================================
Bound                  Value             What it bounds
=====================  ================  ============================================================
max_gpus               1,024             `--gpus` of a reservation
max_cpus               65,536            `--cpus` booked next to the GPUs
max_memory_bytes       1 PiB (2**50)     `--memory` booked next to the GPUs
max_hugepages_1g       65,536            `--hugepages-1g`
max_duration_ms        3650 d            a duration (`--duration`, `--not-after`, `--deadline`, ttls)
max_start_ahead_ms     3650 d            how far ahead a window may start (`--start`, `--until` is
                                         bounded by start + max_duration_ms)
max_name_chars         63                a tenant name: `[A-Za-z0-9][A-Za-z0-9._-]*`, like an id
=====================  ================  ============================================================

The placement pass reads stored rows with the same bounds (`bc.control.capacity.placement_rows`): a row out of
them (written by an older server or by hand) is set aside with an event, never fed to the planner.

What the table implies (checked by `tests/unit/test_limits.py`):

* the largest terminal update (`max_update_bytes`: a maximal result, two
  maximal texts and the ids and signature) fits a frame with room for a Hello,
  so a node can always send each of its results: "nothing a node cannot send";
* a maximal spec or command, in its envelope, fits a gateway frame;
* the Admin replies that carry the largest single things (GetSpec of a maximal
  spec, a command with a maximal result, a batch of `max_batch_nodes` leaves)
  fit under `grpc_message_bytes`;
* an `EnqueueCommands` reply of `max_enqueue_cmds` new commands fits a
  frame for node ids up to their 128 characters and operator names up to
  32 (longer keys or names: the call is refused whole before it commits,
  `bc.control.commands.queue.check_reply_size`); a request must itself fit
  `grpc_message_bytes`, which the client checks before sending.

Refusals are `UsageError`s (exit 2) naming the limit: "the host section is
3,145,728 bytes; the limit is 262,144 bytes (max_section_bytes)".

Pure: no I/O, no grpc.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from bc.errors import UsageError

KIB = 1024
MIB = 1024 * KIB

FRAME_HEADROOM_BYTES = 64 * KIB
"""Between what a sender packs to and what a receiver accepts, so that a framing estimate never kills a stream."""

UPDATE_OVERHEAD_BYTES = KIB
"""A CommandUpdate's fields besides its result and texts: tags, command id, boot id, the node's signature."""

TRUNCATION_MARK = "… [{cut:,} bytes cut]"


@dataclass(frozen=True)
class Limits:
    max_payload_bytes: int = 1 * MIB
    max_result_bytes: int = 1 * MIB
    max_text_bytes: int = 4 * KIB
    max_section_bytes: int = 256 * KIB
    max_spec_bytes: int = 1 * MIB
    max_event_bytes: int = 64 * KIB
    max_batch_nodes: int = 10_000
    max_enqueue_cmds: int = 10_000
    max_frame_bytes: int = 4 * MIB - FRAME_HEADROOM_BYTES
    max_status_bytes: int = 1 * KIB
    max_local_file: int = 16 * MIB
    # Numbers, times and names (issue 29): not bytes, the same table.
    max_gpus: int = 1024
    max_cpus: int = 65_536
    max_memory_bytes: int = 1 << 50
    max_hugepages_1g: int = 65_536
    max_duration_ms: int = 3650 * 86_400_000
    max_start_ahead_ms: int = 3650 * 86_400_000
    max_name_chars: int = 63

    @property
    def grpc_message_bytes(self) -> int:
        """gRPC's receive and send limit on every channel: a frame plus headroom."""
        return self.max_frame_bytes + FRAME_HEADROOM_BYTES

    @property
    def max_update_bytes(self) -> int:
        """The largest CommandUpdate a node sends: a maximal result, a maximal reason and message, ids, signature."""
        return self.max_result_bytes + 2 * self.max_text_bytes + UPDATE_OVERHEAD_BYTES

    @property
    def min_frame_bytes(self) -> int:
        """The smallest frame budget a node may fall back to: one maximal update or event still fits."""
        return max(self.max_update_bytes, self.max_event_bytes) + FRAME_HEADROOM_BYTES

    def grpc_options(self) -> list[tuple[str, int]]:
        """The channel and server options that set gRPC's message limits from this table."""
        return [
            ("grpc.max_receive_message_length", self.grpc_message_bytes),
            ("grpc.max_send_message_length", self.grpc_message_bytes),
        ]


LIMITS = Limits()


def too_large(what: str, size: int, limit_name: str, limits: Limits = LIMITS) -> str | None:
    """The refusal sentence when `size` is over the named limit, else None."""
    limit = int(getattr(limits, limit_name))
    if size <= limit:
        return None
    return f"{what} is {size:,} bytes; the limit is {limit:,} bytes ({limit_name})"


def check_size(what: str, size: int, limit_name: str, limits: Limits = LIMITS) -> None:
    """Raise a UsageError (exit 2) naming the limit when `size` is over it; `what` starts the sentence."""
    why = too_large(what, size, limit_name, limits)
    if why is not None:
        raise UsageError(why)


def check_count(what: str, count: int, limit_name: str, limits: Limits = LIMITS) -> None:
    """Like `check_size`, for a count (e.g. the nodes of a batch)."""
    limit = int(getattr(limits, limit_name))
    if count > limit:
        raise UsageError(f"{what} has {count:,}; the limit is {limit:,} ({limit_name})")


NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
"""A name an operator gives (a tenant): like an id, so it is safe in a table, a CSV cell and a log line."""


def check_range(what: str, value: int, low: int, limit_name: str, limits: Limits = LIMITS) -> None:
    """Raise a UsageError (exit 2) naming `what`, its range and the limit when `value` is outside [low, limit]."""
    high = int(getattr(limits, limit_name))
    if not low <= value <= high:
        raise UsageError(f"{what} must be between {low:,} and {high:,} ({limit_name}), not {value:,}")


def check_name(what: str, name: str, limits: Limits = LIMITS) -> None:
    """Raise a UsageError (exit 2) unless `name` is empty or a name (`NAME`, at most `max_name_chars`)."""
    if not name:
        return
    if len(name) > limits.max_name_chars:
        raise UsageError(f"{what} is {len(name):,} characters; the limit is {limits.max_name_chars} (max_name_chars)")
    if not NAME.fullmatch(name):
        raise UsageError(f"{what} {name!r} is not a name: letters, digits, '.', '_' and '-', from a letter or digit")


def text_size(text: str) -> int:
    return len(text.encode("utf-8"))


def truncate_text(text: str, max_bytes: int) -> str:
    """`text` cut to at most `max_bytes` of UTF-8, with a mark saying how much went; unchanged when it fits."""
    raw = text.encode("utf-8")
    if len(raw) <= max_bytes:
        return text
    # The mark's own length depends on the number it carries; sizing it for the whole text is enough.
    mark = TRUNCATION_MARK.format(cut=len(raw))
    keep = max(0, max_bytes - len(mark.encode("utf-8")))
    head = raw[:keep].decode("utf-8", errors="ignore")  # never split a character
    return head + TRUNCATION_MARK.format(cut=len(raw) - len(head.encode("utf-8")))


__all__ = [
    "FRAME_HEADROOM_BYTES",
    "LIMITS",
    "NAME",
    "Limits",
    "check_count",
    "check_name",
    "check_range",
    "check_size",
    "text_size",
    "too_large",
    "truncate_text",
]
