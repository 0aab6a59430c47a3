"""Capacity through the real CLI against a real `bc serve` (the lab of test_quorum_cli): a hold placed at
once, one that waits pending with its reason and is explained, the new listings, bad input refused in one
sentence with nothing stored, and `bc usage` totals equal to the booked seconds x atoms (I8 over the rows).
Waits are on the server's event stream, never sleeps."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bc.client.admin import AdminClient
from bc.control.capacity.invariants import check_billing_conservation
from bc.control.capacity.placement_pass import span_of
from bc.control.capacity.views import window_of
from bc.protocol import canonical
from bc.protocol.pb import spec_pb2
from bc.runtime.config import OperatorConfig
from bc.store import capacity as cap_sql
from tests.integration.test_cli_cmd import bc, ok_json
from tests.integration.test_quorum_cli import Lab, running_lab


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Lab]:
    yield from running_lab(tmp_path, monkeypatch)


def connected_with_gpus(lab: Lab, node_id: str) -> None:
    async def wait() -> None:
        assert lab.server.operator_config is not None
        async with AdminClient(OperatorConfig.load(lab.server.operator_config)) as c:
            async for _ev in c.watch(type_prefix="node."):
                node = await c.get_node(node_id)
                if node.inventory.gpus and node.state == "connected":
                    return
        raise AssertionError("the event stream ended")

    lab.run(wait())


def test_reserve_wait_explain_list_and_usage_adds_up(lab: Lab) -> None:
    lab.start_node("n1")
    connected_with_gpus(lab, "n1")
    held = ok_json("reserve", "--gpus", "2", "--node", "n1", "--tenant", "acme")
    assert (held["state"], held["node_id"], held["tenant"]) == ("placed", "n1", "acme")
    assert len(held["devices"]) == 2

    waiting = ok_json("reserve", "--gpus", "8", "--node", "n1")
    assert (waiting["state"], waiting["reason"]) == ("pending", "node n1 does not have 8 free GPUs")
    assert waiting.get("node_id", "") == ""
    why = ok_json("capacity", "explain", waiting["id"])
    assert (why["reason"], why["queue_position"]) == ("node n1 does not have 8 free GPUs", 1)
    assert [r["id"] for r in ok_json("reservations", "--state", "pending")] == [waiting["id"]]
    assert [r["id"] for r in ok_json("reservations", "--tenant", "acme")] == [held["id"]]
    assert ok_json("reservation", "show", held["id"])["id"] == held["id"]
    human = bc("capacity", "explain", waiting["id"])
    assert human.exit_code == 0 and "does not have 8 free GPUs" in human.stdout

    assert bc("release", waiting["id"]).exit_code == 0  # pending: released at once, nothing on the node
    assert bc("release", held["id"]).exit_code == 0  # usage ends at the release commit
    assert {r["id"] for r in ok_json("reservations", "--state", "ended")} == {waiting["id"]}

    async def stored() -> tuple[int, int, object]:
        now = await lab.store.now_ms()
        async with lab.store.transaction(write=False) as tx:
            windows = [window_of(r) for r in await cap_sql.usage_windows(tx, None, None)]
            row = await tx.fetchone(
                "SELECT placed_at_ms, ended_at_ms FROM reservations WHERE id = :i", {"i": held["id"]}
            )
            spans = [span_of(r) for r in await cap_sql.unflushed_spans(tx)]
            everything = await tx.fetchall(
                "SELECT r.id, r.node_id, r.tenant, r.device_class, r.gpus, r.placed_at_ms, r.ended_at_ms,"
                " (SELECT MIN(b.start_ms) FROM device_bookings b WHERE b.reservation_id = r.id) AS window_start_ms,"
                " (SELECT MAX(b.end_ms) FROM device_bookings b WHERE b.reservation_id = r.id) AS window_end_ms"
                " FROM reservations r WHERE r.placed_at_ms IS NOT NULL AND r.node_id IS NOT NULL"
            )
        assert row is not None and spans == []  # all flushed at the release
        return (
            int(row["placed_at_ms"]),
            int(row["ended_at_ms"]),
            check_billing_conservation([span_of(r) for r in everything], windows, now),
        )

    placed_at, ended_at, mismatch = lab.run(stored())
    assert mismatch is None
    booked_ms = 2 * (ended_at - placed_at)
    for by in ("reservation", "tenant", "node"):
        rows = ok_json("usage", "--by", by)
        assert sum(r["atom_ms"] for r in rows) == booked_ms, by
        assert sum(r["atom_seconds"] for r in rows) == pytest.approx(booked_ms / 1000)
    assert ok_json("usage", "--by", "tenant")[0]["tenant"] == "acme"
    csv_out = bc("usage", "--by", "node", "--csv")
    assert csv_out.exit_code == 0 and csv_out.stdout.splitlines()[0].startswith("node,atom_seconds,windows,")


@pytest.mark.parametrize(
    ("args", "sentence"),
    [
        (("--duration", "0s"), "a duration must be positive"),
        (("--start", "2020-01-01T00:00Z"), "more than 5 minutes ago"),
        (("--start", "2030-01-01T10:00Z", "--until", "2030-01-01T09:00Z"), "before it starts"),  # within 3650d
        (("--duration", "1h", "--until", "2099-01-01T09:00Z"), "--duration or --until, not both"),
        (("--binding", "lease"), "lease"),
        (("--memory", "lots"), "not a size"),
        (("--selector", "pool"), "key=value"),
        (("--gpus", "9"), "no node in the fleet has 9 GPUs"),
    ],
)
def test_bad_input_is_one_sentence_a_non_zero_exit_and_nothing_stored(
    lab: Lab, args: tuple[str, ...], sentence: str
) -> None:
    lab.start_node("n1")
    connected_with_gpus(lab, "n1")
    full = ("reserve", *(() if "--gpus" in args else ("--gpus", "1")), *args)
    result = bc(*full)
    assert result.exit_code != 0
    assert sentence in result.output
    assert ok_json("reservations", "--all") == []


def test_reserve_wait_prints_each_state_change_until_active(lab: Lab) -> None:
    lab.start_node("n1")
    connected_with_gpus(lab, "n1")
    start_ms = lab.now_ms() + 1500
    when = datetime.fromtimestamp(start_ms / 1000, tz=UTC).isoformat()
    result = bc("reserve", "--gpus", "1", "--node", "n1", "--start", when, "--duration", "1h", "--wait")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert " pending on n1: starts at " in lines[0], lines
    assert " placed on n1" in lines[1] and lines[-1].split()[2:4] == ["active", "on"], lines


def test_host_resources_reach_a_node_that_advertises_limits(lab: Lab) -> None:
    lab.start_node("n1")
    connected_with_gpus(lab, "n1")
    res = ok_json("reserve", "--gpus", "2", "--cpus", "16", "--memory", "128G", "--hugepages-1g", "8")
    assert (res["state"], res["node_id"], res["cpus"]) == ("placed", "n1", 16), res

    async def limits() -> spec_pb2.ResourceLimits:
        async with lab.store.transaction(write=False) as tx:
            row = await tx.fetchone("SELECT spec FROM nodes WHERE node_id = 'n1'")
        assert row is not None
        (a,) = canonical.spec_from_json(str(row["spec"])).devices.assignments
        return a.limits

    lim = lab.run(limits())
    assert (lim.cpu_millis, lim.memory_bytes, lim.hugepages_1gi) == (16_000, 128 << 30, 8)
    assert (lim.cpus, lim.mems) == ("0-55,112-167", "0")  # its GPUs' NUMA node
    # More than the host has can never fit: refused at once.
    too_big = bc("reserve", "--gpus", "1", "--cpus", "999")
    assert too_big.exit_code != 0 and "no node in the fleet has 1 GPU and 999 CPUs" in too_big.output
