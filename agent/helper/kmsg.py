"""The helper's stream of XIDs: the NVIDIA driver's error reports, read from the kernel log as root. Pure, no I/O.

`/dev/kmsg` is readable by root (or any user where `kernel.dmesg_restrict` is
0); the unprivileged agent asks the helper instead:

    kmsg.follow     after_seq (int, -1: all)   a stream: the helper opens the kernel log (its own path: /dev/kmsg
                                               under its root), and answers one frame per NVIDIA XID record the
                                               log still holds, then per new one, until the agent closes

Only XID records cross: each parsed and rebuilt by the helper (`xid_record`)
as its sequence number, the GPU's PCI address, the XID number and the
driver's text, truncated to `MAX_TEXT` characters of printable text. No other
kernel message reaches the agent. The I/O is `agent.helper.follow`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from agent.helper.plans import FollowKmsg, Layout, Plan, Planner, arg_int

MAX_TEXT = 200
MAX_SEQ = (1 << 63) - 1
# `6,1234,5678901,-;NVRM: Xid (PCI:0000:18:00): 79, pid=..., GPU has fallen off the bus.` (the driver's format,
# as agent.hw.nvml reads it directly)
_XID = re.compile(
    r"NVRM: Xid \(PCI:([0-9A-Fa-f]{1,8}):([0-9A-Fa-f]{1,2}):([0-9A-Fa-f]{1,2})(?:\.[0-9A-Fa-f])?\): (\d{1,6}),\s*(.*)"
)
_PRINTABLE = re.compile(r"[^\x20-\x7e]")


def _follow(req: Mapping[str, Any], lay: Layout) -> Plan:
    return (FollowKmsg(lay.kmsg, arg_int(req, "after_seq", -1, MAX_SEQ)),)


def xid_record(line: str) -> dict[str, Any] | None:
    """One kernel log record (`/dev/kmsg`'s `prio,seq,usec,flags;text`, or a plain line) as the XID the helper
    sends, or None when it is not an NVIDIA XID record."""
    header, sep, message = line.partition(";")
    if not sep:
        header, message = "", line
    m = _XID.search(message)
    if m is None:
        return None
    fields = header.split(",")
    seq = int(fields[1]) if len(fields) >= 3 and fields[1].isdigit() and int(fields[1]) <= MAX_SEQ else None
    out: dict[str, Any] = {
        "seq": seq,
        "pci": f"{int(m[1], 16):04x}:{int(m[2], 16):02x}:{int(m[3], 16):02x}",
        "xid": int(m[4]),
        "text": _PRINTABLE.sub("?", m[5].strip())[:MAX_TEXT],
    }
    if len(fields) >= 3 and fields[2].isdigit() and len(fields[2]) <= 20:
        out["uptime_s"] = round(int(fields[2]) / 1e6, 3)
    return out


def wanted(record: Mapping[str, Any], after_seq: int) -> bool:
    """Whether the agent, which has every record up to `after_seq`, still wants `record`."""
    seq = record.get("seq")
    return seq is None or seq > after_seq


TABLE: dict[str, tuple[frozenset[str], Planner]] = {
    "kmsg.follow": (frozenset({"after_seq"}), _follow),
}
STREAMS = frozenset(TABLE)
"""Operations whose answer is a stream of frames on their connection, not one reply."""
