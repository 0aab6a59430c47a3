"""GPU conditions as the control plane sees them: the `GpuHealthy/<uuid>` conditions a node reports, read back.

Pure: a node's stored status (`nodes.status`, its `conditions`, each with the `since_ms` the control plane
derived from the node's age) in, one `GpuCondition` per GPU whose `GpuHealthy` is `False` out. The agent
(`agent.health.rules.gpu_verdict`) names the worst problem in `reason` and every problem in `message`,
joined by `; `; each problem becomes a **signal** the policy matches:

    problem text (agent.health.rules)                 signal            count
    GPU has fallen off the bus                        offbus            1
    N uncorrectable volatile ECC errors               ecc               N
    a row remap failed                                remap-failed      1
    a row remap is pending until the GPU is reset     remap-pending     1
    XID N: …                                          xid:N             1
    throttled: …                                      throttle          1

A message this module cannot read still gives the signal of its `reason` (`Xid79` → `xid:79`), so a
newer agent's wording never hides a condition; a reason it does not know is the signal `other`.

**Node conditions.** The host units' conditions (docs/host.md) are about the node, not one GPU: each bad
one becomes a `GpuCondition` whose `gpu` is "" (the node itself; `NODE` below), with one signal:

    condition (bad when)                              signal
    DriverMismatch (True), reason RebootRequired      driver-reboot     (the default policy reboots the node)
    DriverMismatch (True), any other reason           driver
    FabricManagerReady (False)                        fabric-manager
    ContainerToolkitReady (False)                     container-toolkit
    KubernetesJoined (False)                          kubernetes
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

GPU_HEALTHY = "GpuHealthy/"
NODE = ""
"""The `gpu` of a node condition: the episode, its job and its limits are the node's."""

NODE_CONDITIONS: Mapping[str, tuple[str, str]] = {
    # type: (the status that is bad, its signal)
    "DriverMismatch": ("True", "driver"),
    "FabricManagerReady": ("False", "fabric-manager"),
    "ContainerToolkitReady": ("False", "container-toolkit"),
    "KubernetesJoined": ("False", "kubernetes"),
}
NODE_SIGNALS: tuple[str, ...] = ("driver-reboot", "driver", "fabric-manager", "container-toolkit", "kubernetes")

REASON_SIGNALS: Mapping[str, str] = {
    "FallenOffBus": "offbus",
    "EccUncorrectable": "ecc",
    "RowRemapFailed": "remap-failed",
    "RowRemapPending": "remap-pending",
    "Throttled": "throttle",
}
SIGNALS: tuple[str, ...] = ("offbus", "ecc", "remap-failed", "remap-pending", "xid:N", "throttle", "other")
"""Every signal a condition may carry, as `bc health policy` documents them."""

_XID = re.compile(r"^XID (\d{1,5})\b")
_ECC = re.compile(r"^(\d{1,12}) uncorrectable volatile ECC error")


@dataclass(frozen=True)
class GpuCondition:
    """One sick GPU: what its node reported, and the signals the policy reads."""

    node_id: str
    gpu: str
    reason: str
    message: str
    since_ms: int
    signals: Mapping[str, int] = field(default_factory=dict)  # signal -> count (ECC errors; 1 for the rest)
    type: str = ""
    """The condition's type: `GpuHealthy/<uuid>`, or a node condition's (`DriverMismatch`); "" reads as the GPU's."""

    @property
    def key(self) -> tuple[str, str]:
        return (self.node_id, self.gpu)

    @property
    def on_node(self) -> bool:
        """A node condition (the host units'), not one GPU's."""
        return self.gpu == NODE

    def evidence(self) -> dict[str, Any]:
        """What an event, a batch's reason and `bc health` say of it."""
        out: dict[str, Any] = {"reason": self.reason, "message": self.message, "since_ms": self.since_ms}
        if self.on_node:
            out["type"] = self.type
        return out


def signals_of(reason: str, message: str) -> dict[str, int]:
    """The signals of one `GpuHealthy` condition (see the module's table)."""
    out: dict[str, int] = {}
    for part in (p.strip() for p in message.split(";")):
        if not part:
            continue
        if m := _XID.search(part):
            out[f"xid:{int(m.group(1))}"] = 1
        elif m := _ECC.search(part):
            out["ecc"] = max(out.get("ecc", 0), int(m.group(1)))
        elif part.startswith("GPU has fallen off the bus"):
            out["offbus"] = 1
        elif part.startswith("a row remap failed"):
            out["remap-failed"] = 1
        elif part.startswith("a row remap is pending"):
            out["remap-pending"] = 1
        elif part.startswith("throttled"):
            out["throttle"] = 1
    if reason.startswith("Xid") and reason[3:].isdigit():
        out.setdefault(f"xid:{int(reason[3:])}", 1)
    elif reason in REASON_SIGNALS:
        out.setdefault(REASON_SIGNALS[reason], 1)
    elif not out:
        out["other"] = 1
    return out


def gpu_conditions(node_id: str, conditions: Sequence[Mapping[str, Any]]) -> list[GpuCondition]:
    """The node's sick GPUs from its stored condition list, in GPU order."""
    out: list[GpuCondition] = []
    for c in conditions:
        ctype = str(c.get("type", ""))
        if not ctype.startswith(GPU_HEALTHY) or str(c.get("status", "")) != "False":
            continue
        reason, message = str(c.get("reason", "")), str(c.get("message", ""))
        out.append(
            GpuCondition(
                node_id=node_id,
                gpu=ctype[len(GPU_HEALTHY) :],
                reason=reason,
                message=message,
                since_ms=int(c.get("since_ms", 0) or 0),
                signals=signals_of(reason, message),
                type=ctype,
            )
        )
    return sorted(out, key=lambda g: g.gpu)


def node_conditions(node_id: str, conditions: Sequence[Mapping[str, Any]]) -> list[GpuCondition]:
    """The node's bad host-unit conditions (the module's second table), in type order."""
    out: list[GpuCondition] = []
    for c in conditions:
        ctype = str(c.get("type", ""))
        bad = NODE_CONDITIONS.get(ctype)
        if bad is None or str(c.get("status", "")) != bad[0]:
            continue
        reason = str(c.get("reason", ""))
        signal = "driver-reboot" if ctype == "DriverMismatch" and reason == "RebootRequired" else bad[1]
        out.append(
            GpuCondition(
                node_id=node_id,
                gpu=NODE,
                reason=reason,
                message=str(c.get("message", "")),
                since_ms=int(c.get("since_ms", 0) or 0),
                signals={signal: 1},
                type=ctype,
            )
        )
    return sorted(out, key=lambda g: g.type)


def from_status(node_id: str, status_json: str) -> list[GpuCondition]:
    """`gpu_conditions` of a `nodes.status` text (an unreadable one has none)."""
    return gpu_conditions(node_id, _conditions(status_json))


def node_from_status(node_id: str, status_json: str) -> list[GpuCondition]:
    """`node_conditions` of a `nodes.status` text."""
    return node_conditions(node_id, _conditions(status_json))


def _conditions(status_json: str) -> list[dict[str, Any]]:
    try:
        doc = json.loads(status_json or "{}")
    except ValueError:
        return []
    conds = doc.get("conditions", []) if isinstance(doc, dict) else []
    return [c for c in conds if isinstance(c, dict)]
