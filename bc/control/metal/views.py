"""What clients see of a bare-metal machine: plain data built by `bc.control.metal.machines` and mapped to the
wire by `bc.api.metal_servicer`; `bc metal list/show` and the TUI's machines screen read the same fields."""

from __future__ import annotations

import json
from dataclasses import dataclass

from bc.store import Row


@dataclass(frozen=True)
class MachineView:
    name: str
    site_node: str
    bmc_url: str
    system_id: str
    macs: tuple[str, ...]
    labels: dict[str, str]
    state: str  # enrolled | provisioning | provisioned | failed
    step: str  # the step it is at, or failed at
    reason: str  # a failure's words
    node_id: str  # the installed OS's node, once it joined
    dag_id: str  # the last provisioning job
    enrolled_by: str
    created_at_ms: int
    updated_at_ms: int

    @property
    def shown_state(self) -> str:
        """`enrolled`, `provisioning:<step>`, `provisioned`, `failed:<step>` (as docs/metal.md writes them)."""
        return f"{self.state}:{self.step}" if self.step and self.state in ("provisioning", "failed") else self.state


def machine_view(r: Row) -> MachineView:
    return MachineView(
        name=str(r["name"]),
        site_node=str(r["site_node"]),
        bmc_url=str(r["bmc_url"]),
        system_id=str(r["system_id"]),
        macs=tuple(str(m) for m in json.loads(str(r["macs"] or "[]"))),
        labels={str(k): str(v) for k, v in json.loads(str(r["labels"] or "{}")).items()},
        state=str(r["state"]),
        step=str(r["step"]),
        reason=str(r["reason"]),
        node_id=str(r["node_id"]),
        dag_id=str(r["dag_id"]),
        enrolled_by=str(r["enrolled_by"]),
        created_at_ms=int(r["created_at_ms"]),
        updated_at_ms=int(r["updated_at_ms"]),
    )
