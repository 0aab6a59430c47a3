"""Attack: a node or an operator puts control characters (a newline, a carriage return, an ANSI escape, a
C1 CSI, a bidi override) in a string the CLI shows, to forge lines or steer the operator's terminal.

A real `bc serve` (the quorum CLI tests' lab) holds hostile strings in every field a node reports (its
inventory, sections, conditions, capabilities, labels, a command's result) and every one an operator
writes (reasons of a revocation, a job, a batch, an approver's rejection; an event's data). Then every
read command the CLI has, found by walking its click tree (`show`, `list`, `status`, and the listing
groups), runs in text mode: nothing but the newline between lines comes out raw, and the escape is
visible (`\\x1b`, `\\x0a`, `\\u202e`). A new read command fails the test until it is given its argument
here, so it is covered from its first day.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner
from google.protobuf import json_format

from bc.cli.main import cli
from bc.client.tunnel import TunnelClient
from bc.control.base.events import publish
from bc.control.nodes.status import conditions_doc, status_doc
from bc.protocol.pb import common_pb2
from bc.protocol.pb.session_pb2 import StatusReport
from bc.protocol.text_safety import BIDI_AND_SEPARATORS
from bc.runtime.config import OperatorConfig
from bc.store import commands as commands_sql
from bc.store import metal as metal_sql
from bc.store import nodes as nodes_sql
from tests.integration.test_cli_cmd import ok_json
from tests.integration.test_quorum_cli import Lab, approvers, as_operator, gpu, running_lab
from tests.strategies import HOSTILE_TEXT

# The corpus' strings that hold a character a terminal obeys, and the kinds it lacks (CR, C1, DEL, isolate).
CONTROL = [t for t in HOSTILE_TEXT if any(unicodedata.category(c) == "Cc" or c in BIDI_AND_SEPARATORS for c in t)]
HOSTILE = "".join(CONTROL) + "\r\x9b2J\x7f\u2066z"
"""One string with every kind: it goes in every field (cut to a field's width, a table still shows most)."""

ESCAPED = ("\\x0a", "\\x00", "\\x1b]0;owned\\x07", "\\u202e", "\\x0d", "\\x9b", "\\x7f", "\\u2066")
"""How HOSTILE reads once escaped, piece by piece: what an operator sees instead."""

READ_NAMES = frozenset({"show", "list", "status"})
LISTING = frozenset(
    {"nodes", "approvers", "operators", "events", "reservations", "usage", "jobs slots", "secret versions"}
)
"""Read commands not named show/list/status: groups that list when called alone, and listings by name."""


def raw_controls(text: str) -> list[str]:
    """Every character of `text` a terminal would obey, but the newlines between lines."""
    return [c for c in text if c != "\n" and (unicodedata.category(c) == "Cc" or c in BIDI_AND_SEPARATORS)]


def forged_lines(text: str) -> list[str]:
    """Lines that a hostile newline started: what follows the first newline of HOSTILE, at a line's start."""
    tail = HOSTILE.split("\n", 1)[1][:2]
    return [line for line in text.split("\n") if line.startswith(tail)]


def read_commands() -> list[str]:
    """The read commands of the CLI's click tree (the TUI is tested on its own), as `bc` paths."""
    found: list[str] = []

    def walk(cmd: click.Command, path: list[str], ctx: click.Context) -> None:
        name = " ".join(path)
        if isinstance(cmd, click.Group):
            for sub_name in cmd.list_commands(ctx):
                if path == [] and sub_name == "tui":
                    continue
                sub = cmd.get_command(ctx, sub_name)
                assert sub is not None
                walk(sub, [*path, sub_name], click.Context(sub, parent=ctx, info_name=sub_name))
            if cmd.invoke_without_command and name in LISTING:
                found.append(name)
        elif path[-1] in READ_NAMES or name in LISTING:
            found.append(name)

    walk(cli, [], click.Context(cli, info_name="bc"))
    return sorted(found)


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Lab]:
    yield from running_lab(tmp_path, monkeypatch)


def bc_text(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(cli, list(args), prog_name="bc")
    return r.exit_code, r.output


def hostile_node_report(lab: Lab, node_id: str) -> None:
    """What the gateway stores of a node's status report and hello (bc.control.nodes.status), every string hostile."""
    inventory = common_pb2.Inventory(
        hostname=HOSTILE,
        source=HOSTILE,
        driver_version=HOSTILE,
        cpus=8,
        gpus=[
            common_pb2.Gpu(
                index=0,
                uuid=HOSTILE,
                name=HOSTILE,
                pci_bus_id=HOSTILE,
                memory_mib=81920,
                mig_enabled=True,
                mig_instances=[common_pb2.MigInstance(gi=1, ci=0, uuid=HOSTILE, profile=HOSTILE)],
                healthy=True,
            )
        ],
        # A ramdisk's machine (bc.cli.machine_view): every string the machine's /sys gave it.
        disks=[
            common_pb2.Disk(
                name=HOSTILE, size_bytes=1 << 30, transport=HOSTILE, model=HOSTILE, serial=HOSTILE, mounted=[HOSTILE]
            )
        ],
        nics=[common_pb2.Nic(name=HOSTILE, mac=HOSTILE, speed_mbps=1000, operstate=HOSTILE, pci_bus_id=HOSTILE)],
        pci_gpus=[common_pb2.PciDevice(bus_id=HOSTILE, vendor=HOSTILE, device=HOSTILE, driver=HOSTILE, numa_node=0)],
    )
    report = StatusReport(
        applied_spec_hash=HOSTILE,
        sections=[common_pb2.SectionStatus(section="devices", generation=1, reason=HOSTILE, message=HOSTILE)],
        conditions=[common_pb2.Condition(type=HOSTILE, status=HOSTILE, reason=HOSTILE, message=HOSTILE)],
        inventory=inventory,
        # The VMs it reports (`bc instances`): a foreign domain's name is whatever its creator chose.
        instances=[
            common_pb2.InstanceStatus(
                id=HOSTILE, runtime=HOSTILE, state=HOSTILE, desired=HOSTILE, message=HOSTILE, vcpus=1, memory_mib=512
            )
        ],
    )

    async def write() -> None:
        now = await lab.store.now_ms()
        async with lab.store.transaction() as tx:
            doc = status_doc(report, now, conditions_doc(report, now))
            await nodes_sql.write_status(tx, node_id, json.dumps(doc, sort_keys=True))
            inv = json_format.MessageToJson(inventory, preserving_proto_field_name=True)
            await nodes_sql.write_inventory(tx, node_id, inv, HOSTILE)
            await nodes_sql.write_capabilities(tx, node_id, json.dumps([HOSTILE]))
            await nodes_sql.set_labels(tx, node_id, json.dumps({HOSTILE: HOSTILE}))
            await publish(tx, lab.server.bus, "node.condition", node_id, {"message": HOSTILE, HOSTILE: 1}, now)

    lab.run(write())


def hostile_machine(lab: Lab, name: str) -> None:
    """A machine whose provisioning failed with words a BMC or an agent chose (every other field too)."""

    async def write() -> None:
        now = await lab.store.now_ms()
        async with lab.store.transaction() as tx:
            await metal_sql.insert(
                tx,
                name=name,
                site_node=HOSTILE,
                bmc_url=HOSTILE,
                system_id=HOSTILE,
                macs_json=json.dumps([HOSTILE]),
                labels_json=json.dumps({HOSTILE: HOSTILE}),
                enrolled_by=HOSTILE,
                now_ms=now,
            )
            await metal_sql.set_state(tx, name, "failed", HOSTILE, HOSTILE, now, dag_id=HOSTILE)

    lab.run(write())


def hostile_command(lab: Lab, node_id: str) -> str:
    """A command queued by the CLI that the node settles with a hostile reason and message."""
    doc = ok_json("cmd", "run", node_id, "diag.nvml")

    async def settle() -> None:
        now = await lab.store.now_ms()
        async with lab.store.transaction() as tx:
            done = await commands_sql.settle(
                tx, doc["id"], expected="pending", state="failed", reason=HOSTILE, message=HOSTILE, now_ms=now
            )
            assert done, doc

    lab.run(settle())
    return str(doc["id"])


def hostile_tunnel(lab: Lab, node_id: str) -> None:
    """An exec ticket asked for with a hostile reason (`bc tunnels list` shows it)."""
    assert lab.server.operator_config is not None
    cfg = OperatorConfig.load(lab.server.operator_config)

    async def ask() -> None:
        async with TunnelClient(cfg) as c:
            await c.rotate_key()  # tunnels on: the first exec-ticket key
            await c.issue(node_id, "shell", reason=HOSTILE)

    lab.run(ask())


def fill(lab: Lab, tmp_path: Path) -> dict[str, str]:
    """Hostile strings in every field a node or an operator supplies; the ids the show commands take."""
    # A reservation first, placed on n1's real (fake-hardware) inventory; then n1 goes away and "reports" more.
    lab.start_node("n1")
    lab.wait_for("n1's inventory", lambda: ok_json("nodes", "show", "n1")["inventory"]["gpus"])
    reservation = ok_json("reserve", "--gpus", "1")
    lab.stop_nodes()
    hostile_node_report(lab, "n1")
    command_id = hostile_command(lab, "n1")
    ok_json("nodes", "revoke", "n2", "--reason", HOSTILE)
    job = ok_json("jobs", "run", "cordon", "n1", "--reason", HOSTILE, "--no-wait")
    hostile_machine(lab, "m1")
    hostile_tunnel(lab, "n1")  # before approvers exist: a new ticket key needs no quorum then
    keys = approvers(tmp_path, "alice", "bob", k=2)
    payload = json.dumps({"gpu_uuids": [gpu("n1")]})
    batch = ok_json(
        "batch", "create", "--kind", "gpu.reset", "--nodes", "n1", "--payload", payload, "--reason", HOSTILE
    )
    rejected = as_operator(
        keys["alice"].config, "approve", "reject", batch["id"], "--key", str(keys["alice"].key), "--reason", HOSTILE
    )
    assert rejected.exit_code == 0, rejected.output
    value = tmp_path / "secret-value"
    value.write_bytes(HOSTILE.encode())  # never shown; what is shown is the name, scope and who
    ok_json("secret", "set", "s1", f"@{value}", "--node", "n1", "--label", "pool=a")
    return {
        "secret": "s1",
        "node": "n1",
        "command": command_id,
        "job": str(job["id"]),
        "reservation": str(reservation["id"]),
        "batch": str(batch["id"]),
    }


def argv(path: str, ids: dict[str, str]) -> list[str]:
    """The arguments each read command takes here: a new one must be added (the test says which)."""
    table: dict[str, list[str]] = {
        "approve list": [],
        "approve show": [ids["batch"]],
        "approvers": [],
        "approvers list": [],
        "batch list": [],
        "batch show": [ids["batch"]],
        "cmd list": [],
        "cmd show": [ids["command"]],
        "events": [],
        "health": [],
        "health policy show": [],
        "instances list": [ids["node"]],
        "instances show": [ids["node"], HOSTILE],
        "jobs list": ["--all"],
        "jobs show": [ids["job"]],
        "jobs slots": [],
        "metal list": [],
        "metal show": ["m1"],
        "nodes": ["--all"],
        "nodes show": [ids["node"]],
        "operators": [],
        "operators list": [],
        "pki show": [],
        "release status": [],
        "reservation show": [ids["reservation"]],
        "reservations": ["--all"],
        "secret list": [],
        "secret versions": [ids["secret"]],
        "spec show": [ids["node"]],
        "ssh ca show": [],
        "ssh list": [],
        "tunnels list": [],
        "tunnels record-policy show": [],
        "usage": ["--by", "node"],
    }
    assert path in table, f"`bc {path}` is a read command this test does not run yet: give it its arguments"
    return [*path.split(), *table[path]]


def test_no_show_or_list_command_prints_a_hostile_string_raw(lab: Lab, tmp_path: Path) -> None:
    ids = fill(lab, tmp_path)
    commands = read_commands()
    assert {"nodes show", "cmd show", "jobs show", "approve show", "events", "reservations"} <= set(commands)
    outputs: dict[str, Any] = {}
    for path in commands:
        code, out = bc_text(*argv(path, ids))
        assert code == 0, (path, out)
        assert raw_controls(out) == [] and forged_lines(out) == [], (path, out)
        outputs[path] = out
    for extra in (["usage", "--by", "node", "--csv"], ["nodes", "show", "n2"], ["events", "--type", "node.condition"]):
        code, out = bc_text(*extra)
        assert code == 0 and raw_controls(out) == [] and forged_lines(out) == [], (extra, out)
        outputs[" ".join(extra)] = out

    # What the operator sees instead: the escapes, in full where nothing cuts the field.
    node = outputs["nodes show"]
    assert "INVENTORY  host n1\\x0an9\\x00" in node  # not a line of its own: the same line, escaped
    inventory_line = next(line for line in node.splitlines() if line.startswith("INVENTORY"))
    for escaped in ESCAPED:
        assert escaped in inventory_line, (escaped, inventory_line)
    for path, shown in (("cmd show", ids["command"]), ("jobs show", ids["job"]), ("approve show", ids["batch"])):
        assert shown in outputs[path] and "\\x1b]0;owned\\x07" in outputs[path], (path, outputs[path])
    assert "\\u202e" in outputs["nodes show n2"]  # the revocation's reason
    assert "\\u001b]0;owned\\u0007" in outputs["events --type node.condition"]  # event data is JSON


def test_the_same_strings_stay_whole_in_json(lab: Lab, tmp_path: Path) -> None:
    """JSON is unchanged: it carries them as `\\u` escapes, which parse back to the very string stored."""
    hostile_node_report(lab, "n1")
    code, out = bc_text("nodes", "show", "n1", "--json")
    assert code == 0 and raw_controls(out) == [], out
    assert json.loads(out)["inventory"]["hostname"] == HOSTILE


def test_every_read_command_has_its_place() -> None:
    """The tree walk finds the read commands by name: the ones named above and no command that writes."""
    commands = read_commands()
    assert "nodes show" in commands and "ssh list" in commands and "release status" in commands
    assert not {"nodes revoke", "cmd run", "jobs cancel", "approve sign", "reserve"} & set(commands)
