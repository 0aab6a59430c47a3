"""Sizes over real gRPC (mutual TLS on 127.0.0.1), a real store and real agents on fake GPUs.

* results owed beyond one frame: the Hello carries what fits, the rest follow it,
  and every one lands;
* a gateway whose receive limit is below the table refuses the agent's Hello: the
  agent packs smaller from then on instead of resending the same frame forever;
* what an older agent could send over the limits (a result, an event) is acked as
  refused and published; the agent's own oversized event is published the same way;
* what was stored before the limits (a spec, a command too large for a frame) is
  never sent, and said;
* an Admin request over gRPC's limit is exit 2 naming the limit.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from google.protobuf import any_pb2

from agent.journal import Journal
from agent.journal_rules import TRANSITION, Acceptance
from bc.control.commands import queue as commands
from bc.errors import UsageError
from bc.protocol import canonical, kinds
from bc.protocol.limits import LIMITS, Limits
from bc.protocol.pb import kinds_pb2, session_pb2, spec_pb2
from bc.protocol.pb.session_pb2 import NodeMessage
from bc.store import nodes as nodes_sql
from tests.integration.conftest import InprocLab, open_lab
from tests.integration.test_compromised_gateway import compromise, security_event, settled, until

RESULT_BYTES = 1_000_000  # within max_result_bytes; four of them are more than a frame


async def owe_results(lab: InprocLab, node_id: str, count: int) -> list[str]:
    """Commands queued while the node is away, whose results its journal already holds, unacked.

    What a node that ran them and lost its session before the acks looks like.
    """
    ids = [(await lab.admin.run_command(node_id, "inventory.refresh")).id for _ in range(count)]
    j = await Journal.open(lab.node_dir(node_id) / "journal.db", node_id)
    try:
        for i, cid in enumerate(ids):
            now = time.time()  # the agent sweeps entries older than a week by its wall clock
            await j.accept(Acceptance(cid, "inventory.refresh", True, False, "an-earlier-process", "boot-0", b"", now))
            result = json.dumps({"n": i, "pad": "x" * RESULT_BYTES}).encode()
            update = session_pb2.CommandUpdate(command_id=cid, state=session_pb2.COMMAND_SUCCEEDED, result=result)
            await j.finish(cid, update.SerializeToString(), now + i)
        assert len(await j.unacked_results()) == count
    finally:
        await j.close()
    return ids


async def test_results_beyond_one_frame_follow_the_hello_and_all_land(lab: InprocLab) -> None:
    await lab.join("n1")
    ids = await owe_results(lab, "n1", 6)  # ~6 MB owed; a frame holds under 4
    agent = await lab.start_node("n1")
    for i, cid in enumerate(ids):
        assert (await settled(lab, cid))["state"] == "succeeded"
        info = await lab.admin.get_command(cid)
        assert info.state == "succeeded" and json.loads(info.result_json)["n"] == i  # the journal's result
    await until(_no_unacked(agent.journal))
    assert agent.frame_budget == LIMITS.max_frame_bytes  # nothing was refused on the way
    # ~6 MB of results cannot all ride one list reply: the list answers, keeping what fits.
    listed = await lab.admin.list_commands(node_id="n1")
    assert {c.id for c in listed} == set(ids)
    kept = [c for c in listed if not c.result_omitted]
    assert kept and len(kept) < len(ids)
    assert all(json.loads(c.result_json)["pad"] for c in kept)
    assert all(c.result_json == "" for c in listed if c.result_omitted)


def _no_unacked(j: Journal) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return not await j.unacked_results()

    return check


async def test_a_gateway_refusing_the_hello_gets_smaller_frames_not_the_same_one_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A gateway configured below the table: it accepts frames of 1.5 MB.
    monkeypatch.setattr("bc.assembly.server.LIMITS", Limits(max_frame_bytes=1_500_000))
    async with open_lab(tmp_path) as lab:
        await lab.join("n1")
        ids = await owe_results(lab, "n1", 3)  # a 3 MB Hello: refused before any handler sees it
        agent = await lab.start_node("n1")
        for cid in ids:
            assert (await settled(lab, cid, timeout=30))["state"] == "succeeded"
        assert agent.frame_budget == 1_500_000  # its receive limit less the headroom: the frame it packs to
        await until(_no_unacked(agent.journal))


async def test_an_older_agents_oversized_result_is_acked_as_refused_and_fails_its_command(
    lab: InprocLab, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BC_FAKE_INVENTORY_REFRESH_S", "30")
    t = compromise(lab)  # only to put frames on the stream as an older agent would write them
    await lab.join("n1")
    await lab.start_node("n1")
    await lab.wait_connected("n1")
    cid = (await lab.admin.run_command("n1", "inventory.refresh")).id
    await lab.wait_event("command.updated", lambda ev, d: ev.subject == cid and d["state"] == "running")
    too_big = session_pb2.CommandUpdate(
        command_id=cid, state=session_pb2.COMMAND_SUCCEEDED, result=b"r" * (LIMITS.max_result_bytes + 1)
    )
    await t.inject(NodeMessage(command_update=too_big))
    refused = await security_event(lab, "node.result-too-large", "n1")
    assert refused == {
        "command_id": cid,
        "result_bytes": LIMITS.max_result_bytes + 1,
        "max_result_bytes": LIMITS.max_result_bytes,
    }
    assert (await settled(lab, cid)) == {"node_id": "n1", "state": "failed", "reason": "result-too-large"}
    await until(lambda: any(m.HasField("ack") and cid in m.ack.command_ids for m in t.seen_out))
    info = await lab.admin.get_command(cid)
    assert info.state == "failed" and info.reason == "result-too-large" and info.result_json == ""


async def test_an_oversized_event_is_acked_as_refused_and_said(lab: InprocLab) -> None:
    t = compromise(lab)
    await lab.join("n1")
    agent = await lab.start_node("n1")
    await lab.wait_connected("n1")
    # The agent's own: journaled as event.too-large, published as node.event-too-large.
    own = session_pb2.NodeEvent(type="spec.rejected", body=b"s" * (LIMITS.max_event_bytes + 1))
    await agent.journal.append_events([("spec.rejected", TRANSITION, own.SerializeToString())])
    agent.outbox.poke()
    said = await lab.wait_event(
        "node.event-too-large", lambda ev, d: ev.subject == "n1" and d.get("type") == "spec.rejected"
    )
    assert json.loads(said.data_json)["max_event_bytes"] == LIMITS.max_event_bytes
    # An older agent's, sent as it is: recorded without its body, acked, published.
    big = session_pb2.NodeEvent(seq=1000, type="allocation.bound", body=b"e" * (LIMITS.max_event_bytes + 10))
    await t.inject(NodeMessage(event_batch=session_pb2.EventBatch(journal_id=t.journal_id, events=[big])))
    refused = await lab.wait_event(
        "node.event-too-large", lambda ev, d: ev.subject == "n1" and d.get("type") == "allocation.bound"
    )
    assert json.loads(refused.data_json) == {
        "seq": 1000,
        "type": "allocation.bound",
        "bytes": big.ByteSize(),
        "max_event_bytes": LIMITS.max_event_bytes,
    }
    await until(lambda: any(m.HasField("ack") and m.ack.event_seq >= 1000 for m in t.seen_out))


async def test_what_was_stored_before_the_limits_is_never_sent(lab: InprocLab) -> None:
    await lab.join("n1")
    await lab.start_node("n1")
    connected = await lab.wait_connected("n1")
    store, bus = lab.server.store, lab.server.bus
    assert store is not None
    # A command whose payload is over a frame, enqueued around today's checks (as an older server stored it).
    uuids = [f"GPU-{i:08x}-1111-2222-3333-444444444444" for i in range(110_000)]
    payload = _packed(kinds_pb2.DiagNvmlRequest(gpu_uuids=uuids))
    assert payload.ByteSize() > LIMITS.max_frame_bytes
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        req = commands.EnqueueRequest("n1", "diag.nvml", payload)
        diag = kinds.KINDS["diag.nvml"]
        row = await commands.enqueue_in(tx, bus, lab.server.signer, req, diag, payload, now_ms, lab.server.rng)
    cid = str(row["id"])
    assert (await settled(lab, cid)) == {"node_id": "n1", "state": "failed", "reason": "command-too-large"}
    said = await security_event(lab, "node.command-too-large", "n1")
    assert said["command_id"] == cid and said["max_frame_bytes"] == LIMITS.max_frame_bytes
    # A spec over a frame, written around today's checks.
    spec = spec_pb2.NodeSpec()
    for i in range(5000):
        spec.host.units.add(name=f"u{i:05d}", settings_json=json.dumps({"v": "x" * 900}))
    text = canonical.spec_to_canonical(spec)
    body = session_pb2.DesiredStateBody(node_id="n1", generation=50, spec_hash=canonical.spec_hash(text))
    body.full.CopyFrom(spec)
    async with store.transaction() as tx:
        await nodes_sql.write_spec(tx, "n1", 50, text, canonical.spec_hash(text), body.SerializeToString(), None, "")
    bus.node_changed("n1")
    said = await security_event(lab, "node.spec-too-large", "n1")
    assert said["generation"] == 50 and said["frame_bytes"] > LIMITS.max_frame_bytes
    # The node was never cut off: the session it had is the session it has.
    node = await lab.admin.get_node("n1")
    assert node.state == "connected"
    later = await lab.admin.list_events(after_seq=connected.seq, type_prefix="node.connectivity")
    assert [ev for ev in later if ev.subject == "n1"] == []


async def test_an_admin_request_over_grpcs_limit_is_exit_2_naming_it(lab: InprocLab) -> None:
    await lab.join("n1")
    huge = json.dumps({"units": [{"name": "u1", "settings_json": json.dumps({"v": "x" * (5 * 1024 * 1024)})}]})
    with pytest.raises(UsageError) as e:
        await lab.admin.set_spec_section("n1", "host", huge)
    assert e.value.exit_code == 2
    assert e.value.message.startswith("the request is ")
    assert e.value.message.endswith("at most 4,194,304 bytes (grpc_message_bytes)")
    # Under gRPC's limit but over the section's: the server says which limit.
    big = json.dumps({"units": [{"name": "u1", "settings_json": json.dumps({"v": "x" * (3 * 1024 * 1024)})}]})
    with pytest.raises(UsageError, match=r"^the host section is [\d,]+ bytes; the limit is 262,144 bytes"):
        await lab.admin.set_spec_section("n1", "host", big)


def _packed(msg: kinds_pb2.DiagNvmlRequest) -> any_pb2.Any:
    out = any_pb2.Any()
    out.Pack(msg, deterministic=True)
    return out
