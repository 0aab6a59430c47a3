"""Which XID errors say a GPU needs attention, and what each is called.

XIDs are the driver's error reports. Some are the application's fault (13
graphics engine exception, 31 MMU fault, 43 a channel stopped): the GPU is
fine and the next job runs; those raise no condition. The rest below mean the
GPU, its memory or its links are suspect until a reset proves otherwise
(NVIDIA's XID catalogue and the DCGM health watches agree on this set). An
XID outside both lists counts as critical: an unknown error is not a reason
to keep scheduling on a GPU.
"""

from __future__ import annotations

APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 69})
"""The application's fault or a teardown notice: no condition."""

CRITICAL_XIDS: dict[int, str] = {
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failed",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
}


def is_critical(xid: int) -> bool:
    return xid not in APPLICATION_XIDS


def describe(xid: int) -> str:
    return CRITICAL_XIDS.get(xid, "driver error")
