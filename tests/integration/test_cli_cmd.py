"""`bc cmd` against a real `bc serve` (gRPC, mutual TLS, SQLite file) with nodes joined the real way.

The server runs on its own event loop in a thread, because the CLI under
`CliRunner` calls `asyncio.run` on the test's thread. There is no agent, so
commands stay `pending` unless a test settles them through the same
functions the gateway uses (`mark_dispatched`, `apply_update`).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Coroutine, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from click.testing import CliRunner, Result

from agent.join import join_node
from bc.assembly.server import Seams, ServeOptions, Server
from bc.cli.main import cli
from bc.control.commands.queue import apply_update
from bc.protocol.pb import session_pb2 as pb
from bc.store import Row, Store
from bc.store import commands as cmd_sql
from bc.store import nodes as nodes_sql

T = TypeVar("T")


@dataclass
class Lab:
    server: Server
    loop: asyncio.AbstractEventLoop
    root: Path

    @property
    def store(self) -> Store:
        assert self.server.store is not None
        return self.server.store

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.submit(coro).result(30)

    def join(self, node_id: str, role: str = "node") -> None:
        doc = ok_json("token", "create", "--node-id", node_id, "--role", role)
        self.run(join_node(self.server.address, doc["token"], self.root / f"node-{node_id}"))


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Lab]:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))  # `bc serve` also writes ~/.config/bc/config.json
    for var in ("BC_DATA_DIR", "BC_CONFIG", "BC_DEBUG"):
        monkeypatch.delenv(var, raising=False)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="bc-serve", daemon=True)
    thread.start()
    server = Server(
        ServeOptions(
            data_dir=tmp_path / "server", listen="127.0.0.1:0", heartbeat_interval_s=1.0, command_signing="off"
        ),
        Seams.production(),
    )
    lab = Lab(server, loop, tmp_path)
    try:
        lab.run(server.start())
        monkeypatch.setenv("BC_CONFIG", str(server.operator_config))
        lab.join("n1")
        yield lab
    finally:
        lab.run(server.stop())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def bc(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), prog_name="bc")


def ok_json(*args: str) -> Any:
    result = bc(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def fails(code: int, *args: str) -> str:
    """Run a command that must fail with `code`; returns its one stderr line."""
    result = bc(*args)
    assert result.exit_code == code, result.output
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


# -- run, show, list ---------------------------------------------------------------------


def test_run_queues_a_pending_command(lab: Lab) -> None:
    result = bc("cmd", "run", "n1", "inventory.refresh")
    assert result.exit_code == 0, result.output
    line = result.stdout.strip()
    assert line.startswith("command ") and line.endswith(": inventory.refresh on n1 (seq 1) pending")


def test_run_json_has_the_id_first_and_the_operator_keys(lab: Lab) -> None:
    before = lab.run(lab.store.now_ms())
    doc = ok_json("cmd", "run", "n1", "gpu.reset", "--payload", '{"gpu_uuids": ["GPU-1"]}', "--not-after", "90s")
    after = lab.run(lab.store.now_ms())
    assert next(iter(doc)) == "id"
    assert {"id", "kind", "state", "reason", "result"} <= set(doc)
    assert "result_json" not in doc
    assert (doc["node_id"], doc["kind"], doc["state"], doc["reason"], doc["result"]) == (
        "n1",
        "gpu.reset",
        "pending",
        "",
        None,
    )
    assert (doc["seq"], doc["lane"], doc["attempt"]) == (1, "control", 0)
    assert before + 90_000 <= doc["not_after_ms"] <= after + 90_000
    assert doc["idempotency_key"] == f"cmd:{doc['id']}"
    assert doc["cancel_requested"] is False
    # The payload the node will get is the one given, in the stored body.
    row = lab.run(_get(lab.store, doc["id"]))
    assert b"GPU-1" in bytes(row["body"])


def test_the_default_not_after_is_ten_minutes(lab: Lab) -> None:
    before = lab.run(lab.store.now_ms())
    doc = ok_json("cmd", "run", "n1", "diag.nvml")
    assert before + 600_000 <= doc["not_after_ms"] <= before + 600_000 + 30_000


def test_show_and_list(lab: Lab) -> None:
    lab.join("n2")
    a = ok_json("cmd", "run", "n1", "inventory.refresh")
    b = ok_json("cmd", "run", "n2", "logs.collect", "--payload", '{"max_bytes": 1024}')
    c = ok_json("cmd", "run", "n1", "diag.nvml")

    shown = ok_json("cmd", "show", b["id"])
    assert shown["id"] == b["id"] and shown["lane"] == "bulk" and shown["result"] is None

    listed = ok_json("cmd", "list")
    assert [d["id"] for d in listed] == [c["id"], b["id"], a["id"]]  # newest first
    assert [d["id"] for d in ok_json("cmd", "list", "--node", "n1")] == [c["id"], a["id"]]
    assert ok_json("cmd", "list", "--state", "succeeded") == []
    assert [d["id"] for d in ok_json("cmd", "list", "--limit", "1")] == [c["id"]]

    result = bc("cmd", "list")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["ID", "NODE", "KIND", "STATE", "REASON", "AGE"]
    assert lines[1].split()[:5] == [c["id"], "n1", "diag.nvml", "pending", "-"]
    assert len(lines) == 4

    result = bc("cmd", "show", a["id"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert f"id               {a['id']}" in out
    assert "state            pending" in out and "lane             control" in out


def test_show_prints_the_result_pretty(lab: Lab) -> None:
    cid = ok_json("cmd", "run", "n1", "inventory.refresh")["id"]
    lab.run(_settle(lab, cid, pb.COMMAND_SUCCEEDED, result=b'{"gpus":2,"source":"fake"}'))
    doc = ok_json("cmd", "show", cid)
    assert doc["state"] == "succeeded" and doc["result"] == {"gpus": 2, "source": "fake"}
    result = bc("cmd", "show", cid)
    assert result.exit_code == 0, result.output
    assert 'result\n{\n  "gpus": 2,\n  "source": "fake"\n}' in result.stdout


def test_list_with_nothing_says_so_on_stderr(lab: Lab) -> None:
    result = bc("cmd", "list")
    assert result.exit_code == 0 and result.stdout == "" and "no commands" in result.stderr
    assert ok_json("cmd", "list") == []


# -- idempotency and cancel --------------------------------------------------------------


def test_a_repeated_idempotency_key_returns_the_first_command(lab: Lab) -> None:
    first = ok_json("cmd", "run", "n1", "inventory.refresh", "--idempotency-key", "wf:demo:1")
    again = ok_json("cmd", "run", "n1", "inventory.refresh", "--idempotency-key", "wf:demo:1")
    assert again["id"] == first["id"] and again["seq"] == first["seq"] == 1
    assert again["idempotency_key"] == "wf:demo:1"
    assert len(ok_json("cmd", "list")) == 1


def test_cancel_before_dispatch_wins_and_cancelling_again_is_fine(lab: Lab) -> None:
    cid = ok_json("cmd", "run", "n1", "node.reboot", "--payload", '{"reason": "kernel update"}')["id"]
    result = bc("cmd", "cancel", cid, "--reason", "maintenance moved")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"command {cid}: cancelled"
    doc = ok_json("cmd", "show", cid)
    assert (doc["state"], doc["reason"], doc["message"]) == ("cancelled", "cancelled", "maintenance moved")
    result = bc("cmd", "cancel", cid)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"command {cid}: cancelled"  # cancelling twice is not an error
    assert ok_json("cmd", "cancel", cid)["state"] == "cancelled"


def test_cancel_of_a_settled_command_says_there_is_nothing_to_cancel(lab: Lab) -> None:
    cid = ok_json("cmd", "run", "n1", "inventory.refresh")["id"]
    lab.run(_settle(lab, cid, pb.COMMAND_SUCCEEDED, result=b"{}"))
    result = bc("cmd", "cancel", cid)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"command {cid}: already succeeded; nothing to cancel"


def test_cancel_in_flight_asks_the_node(lab: Lab) -> None:
    cid = ok_json("cmd", "run", "n1", "diag.dcgm", "--payload", '{"level": 3}')["id"]
    lab.run(_dispatch(lab, cid))
    result = bc("cmd", "cancel", cid)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"command {cid}: cancel requested; it is dispatched, the node will be told"
    doc = ok_json("cmd", "show", cid)
    assert doc["state"] == "dispatched" and doc["cancel_requested"] is True


# -- --wait ------------------------------------------------------------------------------


def test_wait_follows_the_command_and_exits_0_on_success(lab: Lab) -> None:
    driver = lab.submit(_settle_next(lab, "n1", pb.COMMAND_SUCCEEDED, result=b'{"ok":true}'))
    result = bc("cmd", "run", "n1", "inventory.refresh", "--wait", "--json")
    cid = driver.result(30)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["id"] == cid and doc["state"] == "succeeded" and doc["result"] == {"ok": True}
    progress = result.stderr.strip()
    assert progress.startswith(f"{cid}: pending") and progress.endswith("→ succeeded")


def test_wait_exits_8_naming_the_state_and_reason_when_it_fails(lab: Lab) -> None:
    driver = lab.submit(_settle_next(lab, "n1", pb.COMMAND_FAILED, reason="nvml-error", message="GPU lost"))
    result = bc("cmd", "run", "n1", "diag.nvml", "--wait")
    cid = driver.result(30)
    assert result.exit_code == 8, result.output
    assert "state            failed (nvml-error)" in result.stdout
    assert result.stderr.splitlines()[-1] == f"error: command {cid} failed: nvml-error"


# -- bad input: one line, the right exit code, nothing queued -----------------------------


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("cmd", "run", "n1", "disk.format"), 2, "error: unknown command kind 'disk.format'; known kinds: bmc.boot,"),
        (("cmd", "run", "n1", "bmc.query"), 2, "error: kind bmc.query does not run on node n1 (role node)"),
        (("cmd", "run", "ghost", "inventory.refresh"), 3, "error: no node named 'ghost'"),
        (("cmd", "run", "n1", "gpu.reset", "--payload", "{nope"), 2, "error: the gpu.reset payload is not valid JSON"),
        (("cmd", "run", "n1", "gpu.reset", "--payload", "[]"), 2, "error: the gpu.reset payload must be a JSON object"),
        (
            ("cmd", "run", "n1", "gpu.reset", "--payload", '{"uuids": ["x"]}'),
            2,
            'error: the gpu.reset payload is not a valid GpuResetRequest: Message type "bc.v1.GpuResetRequest" has no'
            ' field named "uuids"',
        ),
        (("cmd", "run", "n1", "gpu.reset", "--payload", "@/no/such/file"), 2, "error: cannot read the gpu.reset"),
        (("cmd", "run", "n1", "diag.nvml", "--not-after", "8d"), 2, "error: not_after must be between 1 s and 7 days"),
        (
            ("cmd", "run", "n1", "diag.nvml", "--not-after", "soon"),
            2,
            "error: the --not-after 'soon' is not a duration",
        ),
        (("cmd", "show", "01NOSUCHCOMMAND"), 3, "error: no command '01NOSUCHCOMMAND'"),
        (("cmd", "cancel", "01NOSUCHCOMMAND"), 3, "error: no command '01NOSUCHCOMMAND'"),
    ],
)
def test_bad_input_is_one_line_and_queues_nothing(lab: Lab, args: tuple[str, ...], code: int, message: str) -> None:
    line = fails(code, *args)
    assert line.startswith(message), line
    assert ok_json("cmd", "list") == []


def test_a_payload_from_a_file(lab: Lab, tmp_path: Path) -> None:
    path = tmp_path / "payload.json"
    path.write_text('{"gpu_uuids": ["GPU-7"]}\n')
    doc = ok_json("cmd", "run", "n1", "diag.nvml", "--payload", f"@{path}")
    row = lab.run(_get(lab.store, doc["id"]))
    assert b"GPU-7" in bytes(row["body"])


def test_an_unknown_state_filter_is_a_usage_error(lab: Lab) -> None:
    result = bc("cmd", "list", "--state", "bogus")
    assert result.exit_code == 2
    assert "'bogus' is not one of" in result.stderr


# -- helpers that play the gateway's part ---------------------------------------------------


async def _get(store: Store, cid: str) -> Row:
    async with store.transaction(write=False) as tx:
        row = await cmd_sql.get(tx, cid)
    assert row is not None
    return row


async def _dispatch(lab: Lab, cid: str) -> None:
    """Open a session for the command's node on this gateway and mark the command dispatched on it."""
    store = lab.store
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        row = await cmd_sql.get(tx, cid)
        assert row is not None
        node_id = str(row["node_id"])
        opened = await nodes_sql.open_session(
            tx,
            node_id=node_id,
            gateway_id=lab.server.gateway_id,
            journal_id="j1",
            boot_id="boot-1",
            incarnation_id="inc-1",
            cert_serial="",
            now_ms=now_ms,
        )
        assert await cmd_sql.mark_dispatched(tx, cid, node_id, opened.epoch, now_ms)


async def _settle(lab: Lab, cid: str, final: pb.CommandState, **kw: Any) -> None:
    """Dispatch, then report acked, running and `final` as the node would."""
    await _dispatch(lab, cid)
    store = lab.store
    row = await _get(store, cid)
    for state in (pb.COMMAND_ACKED, pb.COMMAND_RUNNING, final):
        extra = kw if state == final else {}
        update = pb.CommandUpdate(command_id=cid, state=state, boot_id="boot-1", **extra)
        async with store.transaction() as tx:
            out = await apply_update(
                tx, lab.server.bus, lab.server.signer, str(row["node_id"]), update, await store.now_ms()
            )
        assert out.changed


async def _settle_next(lab: Lab, node_id: str, final: pb.CommandState, **kw: Any) -> str:
    """Wait (on the events log, no polling sleeps) for the node's next command, then settle it; returns its id."""
    store = lab.store
    while True:
        async with store.transaction(write=False) as tx:
            rows = await cmd_sql.list_(tx, node_id=node_id, state="pending")
        if rows:
            break
        await lab.server.bus.wait_events(1.0)
    cid = str(rows[0]["id"])
    await _settle(lab, cid, final, **kw)
    return cid
