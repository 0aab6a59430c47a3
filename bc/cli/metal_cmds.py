"""`bc metal`: bare-metal machines behind site nodes, and provisioning them as a job (docs/metal.md).

    bc metal enroll MACHINE --site SITE_NODE --bmc URL [--system ID] [--mac MAC]... [--labels k=v]...  (admin)
    bc metal list [--json]                                   every machine and its provisioning state
    bc metal show MACHINE [--json]
    bc metal rm MACHINE [--json]                              (admin)
    bc metal provision MACHINE... --image NAME|URL [--sha256 HEX] --ramdisk-kernel SHA --ramdisk-initrd SHA
                       [--disk NAME] [--labels k=v]... [--max-parallel N] [--no-wait] [--json]   (admin)
    bc metal reprovision NODE --image … (the same, after cordoning and draining NODE)

Provisioning is a job (`bc jobs show`); without --no-wait the command follows it like `bc jobs run` and exits 8
when it did not end `done`. Names, BMC URLs, labels and reasons leave through the escaping writer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from bc.cli.connect import run_client, slow
from bc.cli.emit import emit
from bc.cli.job_cmds import json_option
from bc.cli.job_progress import check_done, follow, job_to_json, progress_line
from bc.cli.output import echo, lines
from bc.cli.render import format_time_ms, parse_duration, render_table
from bc.client.admin import AdminClient
from bc.errors import Unavailable
from bc.protocol.pb import admin_pb2, metal_pb2


def shown_state(m: metal_pb2.MachineInfo) -> str:
    return f"{m.state}:{m.step}" if m.step and m.state in ("provisioning", "failed") else m.state


def machine_doc(m: metal_pb2.MachineInfo) -> dict[str, object]:
    return {
        "name": m.name,
        "site_node": m.site_node,
        "bmc_url": m.bmc_url,
        "system_id": m.system_id,
        "macs": list(m.macs),
        "labels": dict(sorted(m.labels.items())),
        "state": m.state,
        "step": m.step,
        "shown_state": shown_state(m),
        "reason": m.reason,
        "node_id": m.node_id,
        "dag_id": m.dag_id,
        "enrolled_by": m.enrolled_by,
        "created_at_ms": m.created_at_ms,
        "updated_at_ms": m.updated_at_ms,
    }


def _labels_text(m: metal_pb2.MachineInfo) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(m.labels.items())) or "-"


@click.group("metal")
def metal() -> None:
    """Bare-metal machines behind site nodes, and provisioning them (docs/metal.md)."""


@metal.command("enroll")
@click.argument("name", metavar="MACHINE")
@click.option("--site", "site_node", required=True, metavar="SITE_NODE", help="The site node that drives its BMC.")
@click.option("--bmc", "bmc_url", required=True, metavar="URL", help="Its BMC's Redfish root: https://host[:port].")
@click.option("--system", "system_id", default="", metavar="ID", help="The Redfish system id (default: the only one).")
@click.option("--mac", "macs", multiple=True, metavar="MAC", help="A boot NIC's MAC (repeatable).")
@click.option("--labels", "labels", multiple=True, metavar="K=V", help="A label its installed OS gets (repeatable).")
@json_option
def metal_enroll(
    name: str,
    site_node: str,
    bmc_url: str,
    system_id: str,
    macs: tuple[str, ...],
    labels: tuple[str, ...],
    as_json: bool,
) -> None:
    """Register MACHINE behind SITE_NODE: its row and its entry in the site's section (admin)."""
    req = metal_pb2.EnrollMachineRequest(
        name=name, site_node=site_node, bmc_url=bmc_url, system_id=system_id, macs=list(macs), labels=list(labels)
    )
    resp = run_client(lambda c: slow(c, c.enroll_machine(req)))
    m = resp.machine

    def text() -> str:
        head = f"machine {m.name} enrolled on site {m.site_node}"
        if resp.pending_batch_id:
            return f"{head}; the site section change waits for its quorum: bc approve sign {resp.pending_batch_id}"
        return head

    emit(as_json, lambda: {"machine": machine_doc(m), "pending_batch_id": resp.pending_batch_id}, text)


@metal.command("list")
@json_option
def metal_list(as_json: bool) -> None:
    """Every machine: its site, BMC, provisioning state and node."""
    resp = run_client(lambda c: c.list_machines())
    table = render_table(
        ("MACHINE", "SITE", "BMC", "STATE", "NODE", "JOB", "REASON"),
        [
            (m.name, m.site_node, m.bmc_url, shown_state(m), m.node_id or "-", m.dag_id or "-", m.reason or "-")
            for m in resp.machines
        ],
    )
    emit(as_json, lambda: [machine_doc(m) for m in resp.machines], table, empty="no machines")


@metal.command("show")
@click.argument("name", metavar="MACHINE")
@json_option
def metal_show(name: str, as_json: bool) -> None:
    """One machine's fields and where its provisioning stands."""
    m = run_client(lambda c: c.get_machine(name))
    fields = render_table(
        ("FIELD", "VALUE"),
        [
            ("name", m.name),
            ("site", m.site_node),
            ("bmc", m.bmc_url),
            ("system", m.system_id or "-"),
            ("macs", ", ".join(m.macs) or "-"),
            ("labels", _labels_text(m)),
            ("state", shown_state(m)),
            ("reason", m.reason or "-"),
            ("node", m.node_id or "-"),
            ("job", m.dag_id or "-"),
            ("enrolled by", m.enrolled_by or "-"),
            ("updated", format_time_ms(m.updated_at_ms)),
        ],
    )
    emit(as_json, lambda: machine_doc(m), lambda: lines(fields))


@metal.command("rm")
@click.argument("name", metavar="MACHINE")
@json_option
def metal_rm(name: str, as_json: bool) -> None:
    """Forget MACHINE: its row and its site section entry (admin). Refused while a job provisions it."""
    resp = run_client(lambda c: slow(c, c.remove_machine(name)))
    wait = f"; the site section change waits for its quorum: bc approve sign {resp.pending_batch_id}"
    emit(
        as_json,
        lambda: {"name": resp.name, "pending_batch_id": resp.pending_batch_id},
        lambda: f"machine {resp.name} removed" + (wait if resp.pending_batch_id else ""),
    )


def _provision_options(fn: Callable[..., None]) -> Callable[..., None]:
    options = [
        click.option("--image", required=True, metavar="NAME|URL", help="A site cache image's name, or a URL."),
        click.option("--sha256", default="", metavar="HEX", help="The image's SHA-256 (needed for a URL)."),
        click.option("--ramdisk-kernel", required=True, metavar="SHA256", help="The ramdisk kernel in the site cache."),
        click.option("--ramdisk-initrd", required=True, metavar="SHA256", help="The ramdisk initrd in the site cache."),
        click.option("--disk", default="", metavar="NAME", help="The disk to deploy to (default: the first unused)."),
        click.option("--kexec-kernel", default="", metavar="PATH", help="Kernel in the image (default /boot/vmlinuz)."),
        click.option("--kexec-initrd", default="", metavar="PATH", help="Initrd (default /boot/initrd.img)."),
        click.option("--partition", default=0, type=int, help="The image partition holding them (default 1)."),
        click.option("--cmdline", default="", help="The installed OS's kernel command line (bc.join_token is added)."),
        click.option("--labels", "labels", multiple=True, metavar="K=V", help="A label for its node (repeatable)."),
        click.option("--join-timeout", default="30m", show_default=True, help="How long each join may take."),
        click.option("--reason", default="", help="Why (kept with the job)."),
        click.option("--no-wait", is_flag=True, help="Print the job id and return; do not follow it."),
        json_option,
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _provision(req: metal_pb2.ProvisionMachinesRequest, *, no_wait: bool, as_json: bool) -> None:
    async def go(c: AdminClient) -> admin_pb2.JobInfo:
        job = await slow(c, c.provision_machines(req))
        if no_wait or job.terminal:
            return job
        echo(f"job {job.id}: {job.template} submitted; `bc metal list` for the machines", err=True)
        try:
            return await follow(c, job, lambda line: echo(line, err=True))
        except Unavailable as e:
            raise Unavailable(f"{e.message}; job {job.id} goes on without this watch: `bc jobs show {job.id}`") from e

    job = run_client(go)
    emit(as_json, lambda: job_to_json(job), job.id if no_wait else f"{job.id}  {progress_line(job)}")
    if not no_wait:
        check_done(job)


def _request(kw: dict[str, Any], **extra: Any) -> metal_pb2.ProvisionMachinesRequest:
    return metal_pb2.ProvisionMachinesRequest(
        image=str(kw["image"]),
        sha256=str(kw["sha256"]),
        ramdisk_kernel_sha256=str(kw["ramdisk_kernel"]),
        ramdisk_initrd_sha256=str(kw["ramdisk_initrd"]),
        disk=str(kw["disk"]),
        kexec_kernel=str(kw["kexec_kernel"]),
        kexec_initrd=str(kw["kexec_initrd"]),
        partition=int(str(kw["partition"])),
        cmdline=str(kw["cmdline"]),
        labels=list(kw["labels"]),
        join_timeout_s=float(parse_duration(str(kw["join_timeout"]), what="--join-timeout")),
        reason=str(kw["reason"]),
        **extra,
    )


@metal.command("provision")
@click.argument("machines", metavar="MACHINE...", nargs=-1, required=True)
@click.option("--max-parallel", default=0, type=int, help="At most this many machines at once (default: all).")
@_provision_options
def metal_provision(machines: tuple[str, ...], max_parallel: int, no_wait: bool, as_json: bool, **kw: object) -> None:
    """Provision MACHINE... as one job: power off, boot the ramdisk, wipe, deploy, kexec, join (admin)."""
    req = _request(kw, machines=list(machines), max_parallel=max_parallel)
    _provision(req, no_wait=no_wait, as_json=as_json)


@metal.command("reprovision")
@click.argument("node_id", metavar="NODE")
@_provision_options
def metal_reprovision(node_id: str, no_wait: bool, as_json: bool, **kw: object) -> None:
    """Cordon and drain NODE, then provision the machine it runs on again (admin)."""
    _provision(_request(kw, reprovision_node=node_id), no_wait=no_wait, as_json=as_json)


COMMANDS: tuple[click.Command, ...] = (metal,)
