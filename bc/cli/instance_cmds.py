"""`bc instances`: the VMs a node reports (docs/instances.md).

    bc instances list NODE [--json]
    bc instances show NODE INSTANCE [--json]
    bc instances snapshot NODE INSTANCE --upload-url URL [--memory] [--wait] [--json]

`snapshot` queues the command kind `instance.snapshot` (bulk lane, not retry-safe) exactly as
`bc cmd run NODE instance.snapshot --payload …` does: the node captures the disk (and with `--memory` the
VM state), tars, hashes and uploads it to the presigned https URL; the result has its sha256 and size.

Both read the node through `GetNode` (bc.control.reads: the one query path the
TUI's node screen reads too), whose `instances` are the node's last status
report: its managed VMs with their desired state, and the domains bc did not
create (`managed: false`); `list` adds the node's volume store under the table (`--json`: the
instances only; `bc nodes show NODE --json` has `volume_storage`). What a node says is shown through the escaping
writer. An instance the node does not report is NotFound (exit 3).
"""

from __future__ import annotations

import json

import click

from bc.cli.cmd_cmds import cmd_run
from bc.cli.connect import run_client, slow
from bc.cli.emit import emit
from bc.cli.output import Lines, lines, paragraphs
from bc.cli.render import format_mib, render_fields, render_table
from bc.client.fmt import volume_storage_text
from bc.errors import NotFound
from bc.protocol.pb import admin_pb2, common_pb2

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


def _node(node_id: str) -> admin_pb2.NodeInfo:
    info: admin_pb2.NodeInfo = run_client(lambda c: slow(c, c.get_node(node_id)))
    return info


def _instances(node_id: str) -> list[common_pb2.InstanceStatus]:
    return list(_node(node_id).instances)


def render_instances(rows: list[common_pb2.InstanceStatus]) -> Lines:
    return render_table(
        ("INSTANCE", "STATE", "DESIRED", "RUNTIME", "VCPUS", "MEMORY", "BC'S", "MESSAGE"),
        [
            (
                i.id,
                i.state,
                i.desired or "-",
                i.runtime,
                i.vcpus or "-",
                format_mib(i.memory_mib) if i.memory_mib else "-",
                "yes" if i.managed else "no (left alone)",
                i.message,
            )
            for i in rows
        ],
    )


def render_instance(i: common_pb2.InstanceStatus) -> Lines:
    return render_fields(
        [
            ("instance", i.id),
            ("node", i.node_id),
            ("state", i.state),
            ("desired", i.desired or "- (not bc's: reported, never touched)"),
            ("runtime", i.runtime),
            ("vcpus", i.vcpus or "-"),
            ("memory", format_mib(i.memory_mib) if i.memory_mib else "-"),
            ("gpus", ", ".join(i.gpus) or "-"),
            ("volumes", ", ".join(i.volumes) or "-"),
            ("image", i.image_sha256 or "-"),
            ("balloon", f"takes {format_mib(i.balloon_mib)}" if i.balloon_mib else "-"),
            ("restored", i.restored_from or "-"),
            ("identity", f"rebound ({i.identity_rebound_ref})" if i.identity_rebound_ref else "-"),
            ("managed", "yes" if i.managed else "no"),
            ("message", i.message),
        ]
    )


@click.group("instances")
def instances() -> None:
    """The VMs nodes run from their spec's instances section, and those they report but bc did not create."""


@instances.command("list")
@click.argument("node_id", metavar="NODE")
@json_option
def instances_list(node_id: str, as_json: bool) -> None:
    """The instances NODE reported last: state, desired state, size, and why one is not as desired."""
    info = _node(node_id)
    rows = list(info.instances)
    storage = [volume_storage_text(info.volume_storage)] if info.HasField("volume_storage") else []
    emit(
        as_json,
        rows,
        lambda: paragraphs(render_instances(rows), lines(*storage)),
        empty=f"node {node_id} reports no instances",
    )


@instances.command("show")
@click.argument("node_id", metavar="NODE")
@click.argument("instance_id", metavar="INSTANCE")
@json_option
def instances_show(node_id: str, instance_id: str, as_json: bool) -> None:
    """One instance of NODE (bc's own first, when a foreign domain shares its name)."""
    found = [i for i in _instances(node_id) if i.id == instance_id]
    if not found:
        raise NotFound(f"node {node_id} reports no instance {instance_id!r}")
    emit(as_json, found[0], lambda: render_instance(found[0]))


@instances.command("snapshot")
@click.argument("node_id", metavar="NODE")
@click.argument("instance_id", metavar="INSTANCE")
@click.option("--upload-url", required=True, metavar="URL", help="A presigned https URL the snapshot is PUT to.")
@click.option("--memory", is_flag=True, help="Include the VM's memory state (refused with GPUs or a writer volume).")
@click.option("--wait", is_flag=True, help="Follow it until it settles; exit non-zero unless it succeeds.")
@json_option
@click.pass_context
def instances_snapshot(
    ctx: click.Context, node_id: str, instance_id: str, upload_url: str, memory: bool, wait: bool, as_json: bool
) -> None:
    """Snapshot INSTANCE of NODE (its disk, and with --memory its memory) and upload it; prints the command."""
    # through `bc cmd run`: the one path that queues a command and follows it
    payload = json.dumps({"instanceId": instance_id, "includeMemory": memory, "uploadUrl": upload_url})
    ctx.invoke(cmd_run, node_id=node_id, kind="instance.snapshot", payload=payload, wait=wait, as_json=as_json)


COMMANDS: tuple[click.Command, ...] = (instances,)
