"""`bc metal enroll/list/show/rm`: a machine is a row of `metal_machines` and an entry of its site node's
`site` section (`machines[]`), written together in one transaction through the spec path
(`bc.control.quorum.spec_changes.change_section`): the section is a new signed generation, and the change is
root-equivalent (a BMC URL is where the site sends that BMC's credentials), so it is admin's and, once
approvers exist, a `spec.set` batch they sign first (the row is written at once and says so in `reason`).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence

from bc.control.base.actor import Caller
from bc.control.base.bus import Bus
from bc.control.base.events import publish
from bc.control.metal import plan as plan_rules
from bc.control.metal.views import MachineView, machine_view
from bc.control.nodes import specs
from bc.control.quorum import spec_changes
from bc.control.signing.signer import Signer
from bc.errors import Conflict, NotFound, UsageError
from bc.protocol import labels as node_labels
from bc.protocol import site_rules
from bc.protocol.pb import spec_pb2
from bc.store import Store, Tx
from bc.store import metal as metal_sql
from bc.store import nodes as nodes_sql


def _site_machine(name: str, bmc_url: str, system_id: str, macs: Sequence[str]) -> spec_pb2.SiteMachine:
    m = spec_pb2.SiteMachine(name=name, bmc_url=bmc_url, system_id=system_id, macs=[x.strip().lower() for x in macs])
    try:
        site_rules.check_machine("machine", m)
    except site_rules.SiteRuleError as e:
        raise UsageError(f"the {e.field.removeprefix('machine.')} {e.why}") from None
    return m


async def _site_node(tx: Tx, site_node: str) -> None:
    row = await nodes_sql.role_and_labels(tx, site_node)
    if row is None:
        raise NotFound(f"no node named {site_node!r}")
    if str(row["role"]) != "site":
        raise UsageError(f"node {site_node} has the role {row['role']}, not site: machines are enrolled on a site node")


async def enroll(
    store: Store,
    bus: Bus,
    signer: Signer,
    rng: random.Random,
    caller: Caller,
    *,
    name: str,
    site_node: str,
    bmc_url: str,
    system_id: str = "",
    macs: Sequence[str] = (),
    labels: Sequence[str] = (),
) -> tuple[MachineView, str]:
    """Register a machine; returns it and the `spec.set` batch waiting for the quorum ("" when written now)."""
    machine = _site_machine(name, bmc_url, system_id, macs)
    label_map = node_labels.parse_pairs(labels)

    def add(spec: spec_pb2.NodeSpec) -> None:
        site = spec.site
        if any(m.name == name for m in site.machines):
            raise Conflict(f"site {site_node} already lists a machine named {name!r}")
        kept = sorted([*site.machines, machine], key=lambda m: m.name)
        del site.machines[:]
        site.machines.extend(kept)
        try:
            site_rules.check_section(site)
        except site_rules.SiteRuleError as e:
            raise UsageError(f"site {site_node}'s section would be refused: {e}") from None

    async def row(tx: Tx, outcome: spec_changes.SetOutcome) -> None:
        await _site_node(tx, site_node)
        ok = await metal_sql.insert(
            tx,
            name=name,
            site_node=site_node,
            bmc_url=bmc_url,
            system_id=system_id,
            macs_json=json.dumps(list(machine.macs)),
            labels_json=json.dumps(label_map, sort_keys=True),
            enrolled_by=caller.name,
            now_ms=now_ms,
        )
        if not ok:
            raise Conflict(f"a machine named {name!r} is enrolled already; remove it first: bc metal rm {name}")
        if outcome.batch_id:
            why = f"the site section change waits for its quorum: batch {outcome.batch_id}"
            await metal_sql.set_state(tx, name, "enrolled", "", why, now_ms)
        data = {"site": site_node, "bmc_url": bmc_url, "batch_id": outcome.batch_id}
        await publish(tx, bus, "metal.enrolled", name, data, now_ms)

    async with store.transaction(write=False) as tx:
        await _site_node(tx, site_node)
    now_ms = await store.now_ms()
    outcome = await spec_changes.change_section(store, bus, signer, rng, site_node, "site", add, caller, then=row)
    return await show(store, name), outcome.batch_id


async def list_machines(store: Store) -> list[MachineView]:
    async with store.transaction(write=False) as tx:
        return [machine_view(r) for r in await metal_sql.list_all(tx)]


async def show(store: Store, name: str) -> MachineView:
    async with store.transaction(write=False) as tx:
        row = await metal_sql.get(tx, name)
    if row is None:
        raise NotFound(f"no machine named {name!r}")
    return machine_view(row)


async def remove(store: Store, bus: Bus, signer: Signer, rng: random.Random, caller: Caller, name: str) -> str:
    """Forget a machine (row and section entry); refused while a job provisions it. Returns the batch id when
    the section change waits for the quorum ("" when written now)."""
    before = await show(store, name)
    if before.state == "provisioning":
        job = before.dag_id
        raise Conflict(f"machine {name} is being provisioned by job {job}; cancel it first: bc jobs cancel {job}")
    now_ms = await store.now_ms()

    def drop(spec: spec_pb2.NodeSpec) -> None:
        kept = [m for m in spec.site.machines if m.name != name]
        del spec.site.machines[:]
        spec.site.machines.extend(kept)

    async def row(tx: Tx, outcome: spec_changes.SetOutcome) -> None:
        if not await metal_sql.delete(tx, name):
            raise NotFound(f"no machine named {name!r}")
        await publish(tx, bus, "metal.removed", name, {"site": before.site_node, "batch_id": outcome.batch_id}, now_ms)

    outcome = await spec_changes.change_section(
        store, bus, signer, rng, before.site_node, "site", drop, caller, then=row
    )
    return outcome.batch_id


async def plans(store: Store, req: plan_rules.Request) -> list[plan_rules.MachinePlan]:
    """The plans of a provisioning job (`bc metal provision` / `reprovision`), read from the machines and their
    site sections; one sentence on the first thing that is wrong, before anything is stored."""
    async with store.transaction(write=False) as tx:
        if req.reprovision_node:
            row = await metal_sql.by_node(tx, req.reprovision_node)
            if row is None:
                raise NotFound(f"no machine is known to run node {req.reprovision_node!r} (bc metal list)")
            rows = [row]
        else:
            if len(set(req.machines)) != len(req.machines):
                raise UsageError("a machine is named twice; a job provisions each machine once")
            rows = []
            for name in req.machines:
                r = await metal_sql.get(tx, name)
                if r is None:
                    raise NotFound(f"no machine named {name!r}")
                rows.append(r)
        machines = [machine_view(r) for r in rows]
        sites: dict[str, spec_pb2.SiteSection] = {}
        for m in machines:
            if m.site_node not in sites:
                stored, _ = await specs.load_spec(tx, m.site_node)
                sites[m.site_node] = stored.site
    return plan_rules.plan(req, machines, sites)
