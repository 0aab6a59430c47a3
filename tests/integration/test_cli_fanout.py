"""`bc cmd fanout` and Admin `EnqueueCommands` against a real `bc serve` (the lab of test_cli_cmd.py).

One call queues a kind on many nodes, all or none: a refused member is one
sentence naming it, the exit code of its error, and nothing stored. `--wait`
follows the events log until every command settles and exits 8 unless all
succeeded. The gateway's part (dispatch, the node's updates) is played by the
same functions the gateway calls, as in test_cli_cmd.py.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from bc.client.admin import AdminClient
from bc.errors import NotFound, UsageError
from bc.protocol.limits import LIMITS
from bc.protocol.pb import admin_pb2
from bc.protocol.pb import session_pb2 as pb
from bc.runtime.config import OperatorConfig
from tests.integration.test_cli_cmd import Lab, _settle_next, bc, fails, lab, ok_json

__all__ = ["lab"]  # the fixture, imported


@pytest.fixture
def fleet(lab: Lab) -> Lab:
    """n1 (from the lab), n2 and n3 of role node, and s1 of role site."""
    lab.join("n2")
    lab.join("n3")
    lab.join("s1", role="site")
    return lab


def test_fanout_queues_one_command_per_node_in_one_call(fleet: Lab) -> None:
    docs = ok_json("cmd", "fanout", "diag.nvml", "--nodes", "n3,n1", "--not-after", "90s")
    assert [(d["node_id"], d["kind"], d["state"], d["seq"]) for d in docs] == [
        ("n3", "diag.nvml", "pending", 1),
        ("n1", "diag.nvml", "pending", 1),
    ]
    assert all(next(iter(d)) == "id" and d["requested_by"] == "local" for d in docs)
    listed = {c["id"]: c for c in ok_json("cmd", "list")}
    assert set(listed) == {d["id"] for d in docs}
    # One transaction: the two enqueued events are adjacent in the log.
    seqs = [e["seq"] for e in ok_json("events", "--type", "command.enqueued", "--limit", "1000")]
    assert seqs == [seqs[0], seqs[0] + 1]


def test_fanout_prints_a_table_without_json(fleet: Lab) -> None:
    result = bc("cmd", "fanout", "inventory.refresh", "--nodes", "n1,n2")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["ID", "NODE", "SEQ", "STATE"]
    assert [line.split()[1:] for line in lines[1:]] == [["n1", "1", "pending"], ["n2", "1", "pending"]]


def test_all_takes_every_node_whose_role_runs_the_kind(fleet: Lab) -> None:
    docs = ok_json("cmd", "fanout", "inventory.refresh", "--all")  # node and site roles run it
    assert sorted(d["node_id"] for d in docs) == ["n1", "n2", "n3", "s1"]
    docs = ok_json("cmd", "fanout", "gpu.reset", "--all", "--payload", '{"gpu_uuids": ["GPU-1"]}')
    assert sorted(d["node_id"] for d in docs) == ["n1", "n2", "n3"]  # not the site


def test_a_repeated_key_queues_nothing_new(fleet: Lab) -> None:
    first = ok_json("cmd", "fanout", "inventory.refresh", "--nodes", "n1,n2", "--idempotency-key", "sweep-1")
    again = ok_json("cmd", "fanout", "inventory.refresh", "--nodes", "n1,n2,n3", "--idempotency-key", "sweep-1")
    assert [d["id"] for d in again[:2]] == [d["id"] for d in first]
    assert len(ok_json("cmd", "list")) == 3


def test_fanout_naming_an_unknown_node_stores_nothing(fleet: Lab) -> None:
    line = fails(3, "cmd", "fanout", "inventory.refresh", "--nodes", "n1,ghost,n2")
    assert line == "error: command 2 of 3 (inventory.refresh on 'ghost'): no node named 'ghost'"
    assert ok_json("cmd", "list") == []
    assert ok_json("events", "--type", "command.") == []


def test_a_lone_members_refusal_is_runcommands_own_sentence(fleet: Lab) -> None:
    line = fails(2, "cmd", "fanout", "bmc.query", "--nodes", "n1")
    assert line.startswith("error: kind bmc.query does not run on node n1 (role node)"), line


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (
            ("gpu.reset", "--nodes", "n1,s1"),
            2,
            "error: command 2 of 2 (gpu.reset on 's1'): kind gpu.reset does not run",
        ),
        (("disk.format", "--nodes", "n1,n2"), 2, "error: command 1 of 2 (disk.format on 'n1'): unknown command kind"),
        (("gpu.reset", "--nodes", "n1,n2", "--payload", '{"uuids": 1}'), 2, "error: command 1 of 2 (gpu.reset on"),
        (("inventory.refresh", "--nodes", "n1", "--not-after", "8d"), 2, "error: not_after must be between"),
        (("inventory.refresh", "--nodes", "n1,n2,n1"), 2, "error: n1 appears twice in --nodes"),
        (("inventory.refresh", "--nodes", "n1,,n2"), 2, "error: --nodes must be a comma-separated list"),
        (("inventory.refresh",), 2, "error: name the nodes with --nodes n1,n2,… or take them all with --all"),
        (("inventory.refresh", "--nodes", "n1", "--all"), 2, "error: name the nodes with --nodes"),
    ],
)
def test_bad_input_is_one_line_and_stores_nothing(fleet: Lab, args: tuple[str, ...], code: int, message: str) -> None:
    line = fails(code, "cmd", "fanout", *args)
    assert line.startswith(message), line
    assert ok_json("cmd", "list") == []


def test_wait_follows_every_command_and_exits_8_unless_all_succeeded(fleet: Lab) -> None:
    drivers = [
        fleet.submit(_settle_next(fleet, "n1", pb.COMMAND_SUCCEEDED, result=b'{"ok":true}')),
        fleet.submit(_settle_next(fleet, "n2", pb.COMMAND_SUCCEEDED, result=b'{"ok":true}')),
    ]
    result = bc("cmd", "fanout", "inventory.refresh", "--nodes", "n1,n2", "--wait", "--json")
    ids = [d.result(30) for d in drivers]
    assert result.exit_code == 0, result.output
    docs = json.loads(result.stdout)
    assert [d["id"] for d in docs] == ids
    assert all(d["state"] == "succeeded" and d["result"] == {"ok": True} for d in docs)
    away, *progress = result.stderr.strip().splitlines()
    assert away.startswith("2 nodes away: n1 (new: never connected), n2")  # the fixture's nodes never connect
    assert progress[0].startswith("inventory.refresh on 2 nodes: ") and "pending" in progress[0]
    assert progress[-1] == "inventory.refresh on 2 nodes: 2 succeeded"

    drivers = [
        fleet.submit(_settle_next(fleet, "n1", pb.COMMAND_SUCCEEDED)),
        fleet.submit(_settle_next(fleet, "n3", pb.COMMAND_FAILED, reason="nvml-error", message="GPU lost")),
    ]
    result = bc("cmd", "fanout", "diag.nvml", "--nodes", "n1,n3", "--wait")
    failed = drivers[1].result(30)
    assert result.exit_code == 8, result.output
    rows = [line.split() for line in result.stdout.splitlines()[1:]]
    assert [r[1:] for r in rows] == [["n1", "2", "succeeded"], ["n3", "1", "failed", "(nvml-error)"]]
    assert result.stderr.splitlines()[-1] == (
        f"error: 1 of 2 commands did not succeed (1 failed); the first, {failed} on n3: failed (nvml-error)"
    )


# -- the Admin call itself ------------------------------------------------------------------------


def test_enqueue_commands_through_the_client(fleet: Lab) -> None:
    async def go() -> None:
        cfg = OperatorConfig.load(fleet.server.operator_config)
        async with AdminClient(cfg) as admin:
            reqs = [admin_pb2.RunCommandRequest(node_id=f"n{i}", kind="inventory.refresh") for i in (1, 2, 3)]
            infos = await admin.enqueue_commands(reqs)
            assert [i.node_id for i in infos] == ["n1", "n2", "n3"]
            with pytest.raises(NotFound, match=r"^command 3 of 3 \(inventory.refresh on 'n9'\): no node named"):
                await admin.enqueue_commands(
                    [*reqs[:2], admin_pb2.RunCommandRequest(node_id="n9", kind="inventory.refresh")]
                )
            with pytest.raises(UsageError, match=r"^no commands to enqueue"):
                await admin.enqueue_commands([])
            # Over gRPC's message limit: refused by the client, before anything is sent.
            big = admin_pb2.RunCommandRequest(node_id="n1", kind="logs.collect", payload_json="x" * (1 << 20))
            with pytest.raises(UsageError, match=r"\(grpc_message_bytes\): send fewer commands per call$"):
                await admin.enqueue_commands([big] * 5)
            assert LIMITS.grpc_message_bytes < 5 << 20

    asyncio.run(go())
    assert len(ok_json("cmd", "list")) == 3
