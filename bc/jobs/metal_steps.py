"""The provisioning job's steps (docs/metal.md, "Provisioning as jobs"): one command each, awaited.

Every step of `bc metal provision` is a job node on the subject `metal:<machine>` (the machine's lease: two
jobs never drive one machine at once) whose params are the machine's plan (`bc.control.metal.plan`):

* `MetalCommand` sends one command to the site node (`bmc.power`, `boot.prepareRamdisk`, `bmc.boot`,
  `boot.cleanUp`) or to the machine's ramdisk (`disk.wipe`, `deploy.image`, `boot.kexec`) with the
  idempotency key `job:<dag>:<node>`, in the step's transaction, and waits for it to settle. The prepare
  and kexec steps mint the join token of the node that comes next (the ramdisk's, the installed OS's: for
  the plan's node id and role only) in the same transaction; the token travels in the command (the boot
  lease's kernel command line, the kexec command line), never in the job. A ramdisk that goes
  `unreachable` or is deleted under a step fails the step at once (its command is asked to cancel).
  `boot.kexec` is done once the ramdisk accepted it: a kexec's success is the installed OS joining.
* `MetalJoin` waits for the node the token was minted for to join with it (the token used) and be
  connected, for at most the plan's join timeout; the installed OS's gets the plan's labels and becomes
  the machine's `node_id`. A kexec that failed fails it at once.
* `MetalInventory` reads the ramdisk's reported disks and picks the one to deploy to (the plan's, checked,
  or the first that is neither mounted, read-only nor removable).
* `MetalSettle` (a tail) writes the machine's outcome: `provisioned`, or `failed` at the step it was at
  with the first failure's words.

A step records the machine's `provisioning:<step>` when it starts; nothing here runs twice: a restarted
engine re-checks the command a step stored in its detail.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from bc.control.base.events import publish
from bc.control.commands import queue as cmds
from bc.control.commands import states as cs
from bc.control.nodes import specs
from bc.control.quorum import bulk
from bc.jobs.model import NodeState, deps_state, failure_reason
from bc.jobs.step_ctx import DONE, Ctx, Outcome, Primitive
from bc.protocol import connectivity
from bc.protocol import labels as node_labels
from bc.store import commands as cmd_sql
from bc.store import jobs as jobs_sql
from bc.store import metal as metal_sql
from bc.store import nodes as nodes_sql

STEPS: tuple[str, ...] = (
    "power-off",
    "prepare",
    "pxe",
    "power-on",
    "ramdisk",
    "inventory",
    "wipe",
    "deploy",
    "kexec",
    "os",
)
"""The steps in order (their node ids are `<step>:<machine>`); `cleanup` and `settle` are tails."""

COMMAND_STEPS: dict[str, tuple[str, str]] = {
    "power-off": ("site", "bmc.power"),
    "prepare": ("site", "boot.prepareRamdisk"),
    "pxe": ("site", "bmc.boot"),
    "power-on": ("site", "bmc.power"),
    "wipe": ("ramdisk", "disk.wipe"),
    "deploy": ("ramdisk", "deploy.image"),
    "kexec": ("ramdisk", "boot.kexec"),
    "cleanup": ("site", "boot.cleanUp"),
}
"""Each command step: which node it goes to and its kind."""

GONE = (connectivity.UNREACHABLE, connectivity.DELETED)
KEXEC_SENT = (cs.ACKED, cs.RUNNING)
KEXEC_BENIGN = ("timeout", "journal-lost")
"""How a kexec that worked ends: the ramdisk never comes back (`timeout`), or comes back with a new journal."""


def _p(ctx: Ctx, name: str) -> Any:
    return ctx.node.params[name]


async def _mark(ctx: Ctx, step: str) -> None:
    machine = str(_p(ctx, "machine"))
    await metal_sql.set_state(ctx.tx, machine, "provisioning", step, "", ctx.now_ms, dag_id=ctx.dag_id)
    await publish(
        ctx.tx, ctx.bus, "metal.step", machine, {"dag_id": ctx.dag_id, "step": step, "state": "started"}, ctx.now_ms
    )


async def _detail_of(ctx: Ctx, node_id: str) -> dict[str, Any]:
    row = await jobs_sql.node(ctx.tx, ctx.dag_id, node_id)
    return dict(json.loads(str(row["detail"] or "{}"))) if row is not None else {}


async def _mint(ctx: Ctx, node_id: str, role: str) -> str:
    if ctx.tokens is None:
        raise _NoMint(f"this worker holds no CA to mint {node_id}'s join token: run the job queue beside the CA")
    token = await ctx.tokens(
        ctx.tx, ctx.bus, ctx.rng, node_id, role, max(60.0, float(_p(ctx, "join_timeout_s"))), ctx.now_ms
    )
    ctx.detail["token_id"] = token.token_id
    return token.token


class _NoMint(Exception):
    pass


BULK_STEPS: tuple[str, ...] = ("power-off", "pxe", "power-on", "wipe", "deploy")
"""The destructive steps: under a `metal.bulk` batch when approvers exist (each one leaf, in this order)."""


def fixed_payload(step: str, plan: Mapping[str, Any], disk: str) -> dict[str, Any]:
    """A destructive step's payload, known at submit once the disk is: what the batch's leaf and the step hold."""
    m = str(plan["machine"])
    if step in ("power-off", "power-on"):
        return {"machine": m, "action": "off" if step == "power-off" else "on"}
    if step == "pxe":
        return {"machine": m, "device": "pxe"}
    if step == "wipe":
        return {"disks": [disk], "method": "auto"}
    assert step == "deploy", step
    return {"url": plan["image_url"], "sha256": plan["image_sha256"], "disk": disk}


def bulk_leaves(plans: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """The `metal.bulk` batch's leaves for these machines: per machine, its BULK_STEPS in order."""
    out = []
    for plan in plans:
        for step in BULK_STEPS:
            target, kind = COMMAND_STEPS[step]
            doc = fixed_payload(step, plan, str(plan["disk"]))
            out.append((str(plan[target]), kind, json.dumps(doc, sort_keys=True)))
    return out


async def _payload(ctx: Ctx, step: str) -> dict[str, Any]:
    m = str(_p(ctx, "machine"))
    if step in ("power-off", "power-on", "pxe"):
        return fixed_payload(step, ctx.node.params, "")
    if step == "cleanup":
        return {"machine": m}
    if step == "prepare":
        timeout = float(_p(ctx, "join_timeout_s"))
        return {
            "machine": m,
            "kernel_sha256": _p(ctx, "kernel_sha256"),
            "initrd_sha256": _p(ctx, "initrd_sha256"),
            "join_token": await _mint(ctx, str(_p(ctx, "ramdisk")), "ramdisk"),
            "lease_s": int(min(86_400, max(3600, 4 * timeout))),
            "image_sha256": [_p(ctx, "image_sha256")],
        }
    disk = str((await _detail_of(ctx, f"inventory:{m}")).get("disk", ""))
    if step in ("wipe", "deploy"):
        return fixed_payload(step, ctx.node.params, disk)
    assert step == "kexec", step
    token = await _mint(ctx, str(_p(ctx, "os_node")), "node")
    cmdline = " ".join(x for x in (str(_p(ctx, "cmdline")), f"bc.join_token={token}") if x)
    return {
        "disk": disk,
        "partition": int(_p(ctx, "partition")),
        "kernel": _p(ctx, "kexec_kernel"),
        "initrd": _p(ctx, "kexec_initrd"),
        "cmdline": cmdline,
    }


# -- MetalCommand ---------------------------------------------------------------------------------------


async def _command_start(ctx: Ctx) -> Outcome | None:
    step = str(_p(ctx, "step"))
    target, kind_name = COMMAND_STEPS[step]
    if not ctx.node.tail:
        await _mark(ctx, step)
    node_id = str(_p(ctx, target))
    ctx.detail["node"] = node_id
    if ctx.param("batch_node"):  # its leaf of the job's metal.bulk batch, approved: made and released now
        batch_id = str((await _detail_of(ctx, str(ctx.param("batch_node")))).get("batch_id", ""))
        if not batch_id:
            return Outcome(False, f"{step}: the job's metal.bulk batch was never made")
        leaf = int(ctx.param("leaf"))
        ctx.detail["batch_id"] = batch_id
        ctx.detail["command_id"] = await bulk.release_bulk_leaf(
            ctx.tx, ctx.bus, ctx.signer, ctx.rng, batch_id, leaf, ctx.requested_by, ctx.now_ms
        )
        return await _command_check(ctx)
    try:
        payload_doc = await _payload(ctx, step)
    except _NoMint as e:
        return Outcome(False, f"{step}: {e}")
    kind = cmds.kind_of(kind_name)
    payload = cmds.payload_from_json(kind_name, json.dumps(payload_doc))
    req = cmds.EnqueueRequest(
        node_id, kind_name, payload, idempotency_key=f"job:{ctx.dag_id}:{ctx.node.id}", requested_by=ctx.requested_by
    )
    row = await cmds.enqueue_in(ctx.tx, ctx.bus, ctx.signer, req, kind, payload, ctx.now_ms, ctx.rng)
    ctx.detail["command_id"] = str(row["id"])
    return await _command_check(ctx)


def _command_failure(step: str, row: dict[str, Any], node_id: str) -> str:
    why = str(row["reason"] or "")
    msg = str(row["message"] or "")
    return (
        f"{step}: {row['kind']} on {node_id} {row['state']}"
        + (f" ({why})" if why else "")
        + (f": {msg}" if msg else "")
    )


async def _command_check(ctx: Ctx) -> Outcome | None:
    step = str(_p(ctx, "step"))
    node_id = str(ctx.detail.get("node", ""))
    row = await cmd_sql.get(ctx.tx, str(ctx.detail["command_id"]))
    if row is None:
        return Outcome(False, f"{step}: command {ctx.detail['command_id']} is gone")
    state = str(row["state"])
    if state == cs.SUCCEEDED or (step == "kexec" and state in KEXEC_SENT):
        return DONE
    if step == "kexec" and state in cs.TERMINAL and str(row["reason"] or "") in KEXEC_BENIGN:
        return DONE  # it ran and the ramdisk is gone, as a kexec leaves it: the installed OS's join decides
    if state in cs.TERMINAL:
        return Outcome(False, _command_failure(step, row, node_id))
    if COMMAND_STEPS[step][0] == "ramdisk":
        node = await nodes_sql.get(ctx.tx, node_id, include_deleted=True)
        where = connectivity.DELETED if node is None or node["deleted_at_ms"] is not None else str(node["connectivity"])
        if where in GONE:
            await cmds.request_cancel_in(
                ctx.tx, ctx.bus, str(row["id"]), f"job {ctx.dag_id}: ramdisk {where}", ctx.now_ms
            )
            return Outcome(False, f"{step}: the ramdisk {node_id} is {where}; its {row['kind']} was cancelled")
    return None


async def _command_cancel(ctx: Ctx) -> Outcome | None:
    cid = ctx.detail.get("command_id")
    if cid:
        await cmds.request_cancel_in(ctx.tx, ctx.bus, str(cid), f"job {ctx.dag_id} cancelled", ctx.now_ms)
        return await _command_check(ctx)
    return None


# -- MetalJoin --------------------------------------------------------------------------------------------


async def _join_start(ctx: Ctx) -> Outcome | None:
    step = str(_p(ctx, "step"))
    await _mark(ctx, step)
    ctx.detail["deadline_ms"] = ctx.now_ms + round(float(_p(ctx, "join_timeout_s")) * 1000)
    minted_by = f"{'prepare' if step == 'ramdisk' else 'kexec'}:{_p(ctx, 'machine')}"
    ctx.detail["token_id"] = str((await _detail_of(ctx, minted_by)).get("token_id", ""))
    return await _join_check(ctx)


async def _join_check(ctx: Ctx) -> Outcome | None:
    step = str(_p(ctx, "step"))
    node_id = str(_p(ctx, "ramdisk" if step == "ramdisk" else "os_node"))
    token_id = str(ctx.detail.get("token_id", ""))
    joined = bool(token_id) and await metal_sql.token_used(ctx.tx, token_id)
    node = await nodes_sql.get(ctx.tx, node_id) if joined else None
    if node is not None and str(node["connectivity"]) == connectivity.CONNECTED:
        if step == "os":
            await _label(ctx, node_id, dict(_p(ctx, "labels")))
            await metal_sql.set_node(ctx.tx, str(_p(ctx, "machine")), node_id, ctx.now_ms)
        return DONE
    if step == "os" and not joined:
        kexec = await _detail_of(ctx, f"kexec:{_p(ctx, 'machine')}")
        row = await cmd_sql.get(ctx.tx, str(kexec.get("command_id", ""))) if kexec.get("command_id") else None
        ended = row is not None and str(row["state"]) in cs.TERMINAL and str(row["state"]) != cs.SUCCEEDED
        if row is not None and ended and str(row["reason"] or "") not in KEXEC_BENIGN:
            return Outcome(False, _command_failure("kexec", row, str(kexec.get("node", ""))))
    if ctx.now_ms >= int(ctx.detail["deadline_ms"]):
        what = "the ramdisk" if step == "ramdisk" else "the installed OS"
        return Outcome(
            False, f"{step}: {what} did not join as {node_id} within {float(_p(ctx, 'join_timeout_s')):.0f} s"
        )
    return None


async def _label(ctx: Ctx, node_id: str, labels: dict[str, str]) -> None:
    row = await nodes_sql.role_and_labels(ctx.tx, node_id)
    if row is None or not labels:
        return
    before = json.loads(str(row["labels"] or "{}"))
    after = node_labels.edit(before, labels, [])
    if after != before:
        await nodes_sql.set_labels(ctx.tx, node_id, json.dumps(after, sort_keys=True))
        await publish(ctx.tx, ctx.bus, "node.labelled", node_id, {"set": labels, "removed": []}, ctx.now_ms)
        await specs.write_spec(ctx.tx, ctx.bus, ctx.signer, node_id, lambda _spec: None, ctx.now_ms)


async def _join_cancel(ctx: Ctx) -> Outcome | None:
    return Outcome(False, f"{_p(ctx, 'step')}: job {ctx.dag_id} cancelled while waiting for a join", cancelled=True)


# -- MetalInventory ---------------------------------------------------------------------------------------


def wrong_machine(reported: list[str], enrolled: list[str]) -> str:
    """Why the ramdisk is not on the enrolled machine ("" when it is, or when it reports no NIC to tell by)."""
    if not reported or not enrolled or set(reported) & {m.lower() for m in enrolled}:
        return ""
    return (
        f"the ramdisk reports none of the machine's enrolled MACs ({', '.join(enrolled)}; it has"
        f" {', '.join(reported[:4])}): another machine booted with its token?"
    )


def pick_disk(disks: list[dict[str, Any]], wanted: str) -> tuple[str, str]:
    """(the disk to deploy to, "") or ("", why none): the named one if usable, else the first usable one."""

    def why_not(d: dict[str, Any]) -> str:
        if d.get("mounted"):
            return f"in use ({', '.join(str(x) for x in d['mounted'])})"
        if d.get("read_only"):
            return "read-only"
        if d.get("removable") and not wanted:
            return "removable"
        return ""

    if wanted:
        d = next((d for d in disks if d.get("name") == wanted), None)
        if d is None:
            return "", f"the ramdisk reports no disk {wanted}"
        bad = why_not(d)
        return ("", f"disk {wanted} is {bad}") if bad else (wanted, "")
    usable = [str(d["name"]) for d in disks if d.get("name") and not why_not(d)]
    return (usable[0], "") if usable else ("", f"none of the {len(disks)} disk(s) the ramdisk reports is usable")


async def _inventory_start(ctx: Ctx) -> Outcome | None:
    await _mark(ctx, "inventory")
    ctx.detail["deadline_ms"] = ctx.now_ms + 300_000
    return await _inventory_check(ctx)


async def _inventory_check(ctx: Ctx) -> Outcome | None:
    ramdisk = str(_p(ctx, "ramdisk"))
    node = await nodes_sql.get(ctx.tx, ramdisk)
    inventory = json.loads(str(node["inventory"] or "{}")) if node is not None else {}
    disks = list(inventory.get("disks", []))
    if disks:
        why = wrong_machine([str(n.get("mac", "")).lower() for n in inventory.get("nics", [])], ctx.param("macs", []))
        if why:
            return Outcome(False, f"inventory: {why}")
        disk, why = pick_disk(disks, str(_p(ctx, "disk")))
        if not disk:
            return Outcome(False, f"inventory: {why}")
        ctx.detail["disk"] = disk
        ctx.detail["disks"] = len(disks)
        return DONE
    if node is None or str(node["connectivity"]) in GONE:
        return Outcome(False, f"inventory: the ramdisk {ramdisk} is gone")
    if ctx.now_ms >= int(ctx.detail["deadline_ms"]):
        return Outcome(False, f"inventory: the ramdisk {ramdisk} reported no disks in 300 s")
    return None


async def _inventory_cancel(ctx: Ctx) -> Outcome | None:
    return Outcome(False, f"inventory: job {ctx.dag_id} cancelled", cancelled=True)


# -- MetalSettle (tail) -----------------------------------------------------------------------------------


async def _settle(ctx: Ctx) -> Outcome | None:
    machine = str(_p(ctx, "machine"))
    row = await metal_sql.get(ctx.tx, machine)
    if row is None:
        return DONE  # removed meanwhile (not while provisioning: `bc metal rm` refuses that)
    root = [d for d in ctx.deps if d.node == f"metal:{machine}"]
    state = deps_state(root or ctx.deps)
    if state == NodeState.DONE:
        cleanup = [d for d in ctx.deps if d.node == f"cleanup:{machine}" and d.state != NodeState.DONE]
        note = f"provisioned, but {cleanup[0].error or 'boot.cleanUp did not run'}" if cleanup else ""
        await metal_sql.set_state(ctx.tx, machine, "provisioned", "", note, ctx.now_ms, dag_id=ctx.dag_id)
        data: dict[str, object] = {"dag_id": ctx.dag_id, "state": "provisioned", "node_id": str(_p(ctx, "os_node"))}
    else:
        step = str(row["step"]) if str(row["state"]) == "provisioning" and row["step"] else "queued"
        failed = await jobs_sql.node(ctx.tx, ctx.dag_id, f"{step}:{machine}")
        own = str(failed["error"] or "") if failed is not None else ""
        reason = own or failure_reason(ctx.deps, ctx.first_error) or ctx.first_error or state.value
        await metal_sql.set_state(ctx.tx, machine, "failed", step, reason, ctx.now_ms, dag_id=ctx.dag_id)
        data = {"dag_id": ctx.dag_id, "state": "failed", "step": step, "error": reason}
    await publish(ctx.tx, ctx.bus, "metal.outcome", machine, data, ctx.now_ms)
    return DONE


PRIMITIVES: dict[str, Primitive] = {
    "MetalCommand": Primitive(_command_start, _command_check, _command_cancel),
    "MetalJoin": Primitive(_join_start, _join_check, _join_cancel),
    "MetalInventory": Primitive(_inventory_start, _inventory_check, _inventory_cancel),
    "MetalSettle": Primitive(_settle),
}
