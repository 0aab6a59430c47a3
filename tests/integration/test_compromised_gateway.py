"""A compromised gateway can delay, drop or read frames, and nothing more.

The gateway here is the production gateway with its links wrapped by a
tamperer (the code a compromised gateway would run): it rewrites, swaps,
strips or injects frames between the real control plane and a real agent.
Every forgery must be refused by the agent or the control plane, leave a
`security.*` event, and change nothing that matters.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from agent.hw.fake import FakeHardware
from bc.pki import attest, keys
from bc.pki.identity import PeerIdentity
from bc.protocol import closing
from bc.protocol.pb import admin_pb2, session_pb2
from bc.protocol.pb.session_pb2 import CloseReason, GatewayMessage, NodeMessage
from bc.seams.link import Link
from tests.integration.conftest import InprocLab

Out = Callable[[GatewayMessage], GatewayMessage | None]
In = Callable[[NodeMessage], NodeMessage | None]


@dataclass
class Tamperer:
    """Sits between the gateway and the node's stream; `outbound`/`inbound` may rewrite or drop (None) frames."""

    outbound: Out | None = None
    inbound: In | None = None
    journal_id: str = ""
    seen_out: list[GatewayMessage] = field(default_factory=list)
    current: TamperingLink | None = None

    async def inject(self, msg: NodeMessage) -> None:
        """A frame the gateway makes up, as if the node had sent it on the current session."""
        assert self.current is not None, "no session to inject into"
        await self.current.frames.put(msg)


class TamperingLink:
    def __init__(self, inner: Link[NodeMessage, GatewayMessage], t: Tamperer) -> None:
        self.inner, self.t = inner, t
        self.frames: asyncio.Queue[NodeMessage | None] = asyncio.Queue()
        self.pump = asyncio.ensure_future(self._pump())
        t.current = self

    async def _pump(self) -> None:
        """The node's real frames, filtered, merged with injected ones (a read is never cancelled midway)."""
        try:
            while True:
                msg = await self.inner.recv()
                if msg is None:
                    break
                if msg.HasField("hello"):
                    self.t.journal_id = msg.hello.journal_id
                kept = self.t.inbound(msg) if self.t.inbound else msg
                if kept is not None:
                    await self.frames.put(kept)
        finally:
            await self.frames.put(None)

    async def send(self, msg: GatewayMessage) -> None:
        self.t.seen_out.append(msg)  # as the control plane wrote it
        copy = GatewayMessage()
        copy.CopyFrom(msg)
        out = self.t.outbound(copy) if self.t.outbound else copy
        if out is not None:
            await self.inner.send(out)

    async def recv(self) -> NodeMessage | None:
        msg = await self.frames.get()
        if msg is None and self.pump.done() and not self.pump.cancelled() and self.pump.exception() is not None:
            raise self.pump.exception()  # type: ignore[misc]
        return msg

    async def close(
        self, code: str, details: str, reason: CloseReason = closing.UNSPECIFIED, *, retry_after_ms: int | None = None
    ) -> None:
        self.pump.cancel()
        await self.inner.close(code, details, reason, retry_after_ms=retry_after_ms)


def compromise(lab: InprocLab) -> Tamperer:
    t = Tamperer()
    gw = lab.server.gateway
    real_serve = gw.serve

    async def serve(link: Link[NodeMessage, GatewayMessage], peer: PeerIdentity) -> None:
        await real_serve(TamperingLink(link, t), peer)

    gw.serve = serve  # type: ignore[method-assign]
    return t


async def settled(lab: InprocLab, command_id: str, timeout: float = 15.0) -> dict[str, Any]:
    ev = await lab.wait_event("command.settled", lambda ev, d: ev.subject == command_id, timeout)
    return dict(json.loads(ev.data_json))


async def security_event(lab: InprocLab, type_: str, node_id: str, timeout: float = 15.0) -> dict[str, Any]:
    ev = await lab.wait_event(type_, lambda ev, d: ev.subject == node_id, timeout)
    return dict(json.loads(ev.data_json))


def rewrite_command_body(msg: GatewayMessage, change: Callable[[session_pb2.CommandBody], None]) -> None:
    body = session_pb2.CommandBody.FromString(msg.command.envelope.body)
    change(body)
    msg.command.envelope.body = body.SerializeToString(deterministic=True)


async def until(cond: Callable[[], Awaitable[bool] | bool], timeout: float = 15.0) -> None:
    """Poll a condition the test cannot be woken for (the agent's journal or memory), with a deadline."""
    async with asyncio.timeout(timeout):
        while True:
            ok = cond()
            if ok if isinstance(ok, bool) else await ok:
                return
            await asyncio.sleep(0.05)


def _journal_done(lab: InprocLab, node_id: str, command_id: str) -> Callable[[], Awaitable[bool]]:
    async def done() -> bool:
        entry = await lab.agents[node_id].journal.get_command(command_id)
        return entry is not None and entry.state == "done"

    return done


async def start(lab: InprocLab, node_id: str = "n1") -> Tamperer:
    t = compromise(lab)
    await lab.join(node_id)
    await lab.start_node(node_id)
    await lab.wait_connected(node_id)
    return t


# -- signed intent: commands -----------------------------------------------------------------------


async def test_a_tampered_command_body_is_refused_and_nothing_runs(lab: InprocLab) -> None:
    t = await start(lab)
    gpu = lab.agents["n1"].inventory.gpus[0].uuid
    other = lab.agents["n1"].inventory.gpus[1].uuid

    def retarget(msg: GatewayMessage) -> GatewayMessage:
        if msg.HasField("command"):
            # Same kind, another GPU: what an attacker would want, and still a well-formed body.
            rewrite_command_body(msg, lambda b: b.payload.Pack(reset_request(other)))
        return msg

    t.outbound = retarget
    info = await lab.admin.run_command("n1", "gpu.reset", payload_json=json.dumps({"gpu_uuids": [gpu]}))
    done = await settled(lab, info.id)
    assert done["state"] == "rejected" and done["reason"] == "BAD_SIGNATURE"
    sec = await security_event(lab, "security.bad-signature", "n1")
    assert sec["command_id"] == info.id and "does not match" in sec["why"]
    assert FakeHardware.read_resets(lab.node_dir("n1")) == {}


async def test_a_swapped_signature_is_refused(lab: InprocLab) -> None:
    t = await start(lab)
    first = await lab.admin.run_command("n1", "inventory.refresh")
    assert (await settled(lab, first.id))["state"] == "succeeded"
    stolen = next(m.command.envelope.signature for m in t.seen_out if m.HasField("command"))

    def swap(msg: GatewayMessage) -> GatewayMessage:
        if msg.HasField("command"):
            msg.command.envelope.signature = stolen  # a real signature by the real worker key, for another body
        return msg

    t.outbound = swap
    info = await lab.admin.run_command("n1", "diag.nvml")
    done = await settled(lab, info.id)
    assert done["state"] == "rejected" and done["reason"] == "BAD_SIGNATURE"
    await security_event(lab, "security.bad-signature", "n1")


async def test_a_stripped_signature_is_refused_whatever_the_kind(lab: InprocLab) -> None:
    t = await start(lab)

    def strip(msg: GatewayMessage) -> GatewayMessage:
        if msg.HasField("command"):
            env = msg.command.envelope
            env.ClearField("signature")
            env.ClearField("key_id")
            env.ClearField("cert_chain")
            # And claim a harmless kind in the body: whether a signature is needed never depends on the body.
            rewrite_command_body(msg, lambda b: setattr(b, "attested", False))
        return msg

    t.outbound = strip
    info = await lab.admin.run_command("n1", "inventory.refresh")
    done = await settled(lab, info.id)
    assert done["state"] == "rejected" and done["reason"] == "BAD_SIGNATURE"
    sec = await security_event(lab, "security.bad-signature", "n1")
    assert sec["why"] == "unsigned"


def reset_request(uuid: str) -> Any:
    from bc.protocol.pb import kinds_pb2

    return kinds_pb2.GpuResetRequest(gpu_uuids=[uuid])


# -- signed intent: specs --------------------------------------------------------------------------


# The replay of an old signed spec relabelled with a higher generation runs on virtual time, where the
# 10 s backstop that ends it takes no wall time: tests/sim/test_compromised_gateway_timed.py.


async def test_an_unsigned_spec_is_not_applied(lab: InprocLab) -> None:
    t = await start(lab)
    await lab.wait_observed("n1", 1)

    def strip(msg: GatewayMessage) -> GatewayMessage:
        if msg.HasField("desired_state"):
            msg.desired_state.envelope.ClearField("signature")
        return msg

    t.outbound = strip
    await lab.admin.set_spec_section("n1", "telemetry", json.dumps({"export_interval_s": 30}))
    sec = await security_event(lab, "security.spec-rejected", "n1")
    assert sec["generation"] == 2 and sec["reason"] == "unsigned"
    assert lab.agents["n1"].applied_generation == 1


# -- attested bindings and results ------------------------------------------------------------------


def forged_bound(node_id: str, reservation: admin_pb2.Reservation, seq: int, sig: bytes) -> session_pb2.NodeEvent:
    rep = session_pb2.AllocationReport(
        node_id=node_id,
        allocation_id=reservation.allocation_id,
        reservation_id=reservation.id,
        kind=session_pb2.AllocationReport.BOUND,
        generation=reservation.generation,
    )
    body = rep.SerializeToString(deterministic=True)
    return session_pb2.NodeEvent(
        seq=seq,
        type="allocation.bound",
        **{"class": session_pb2.RESULT},
        report=session_pb2.AttestedReport(body=body, node_sig=sig),
    )


async def test_a_forged_allocation_bound_never_activates_a_reservation(lab: InprocLab) -> None:
    t = await start(lab)
    await lab.join("n2")  # another node's key: a foreign signature

    # The gateway swallows the node's real reports and makes up its own.
    t.inbound = lambda m: None if m.HasField("event_batch") else m
    res = await lab.admin.reserve(1, node_id="n1")
    await lab.wait_observed("n1", 2)

    n2_key = keys.load_key_pem((lab.node_dir("n2") / "node.key").read_bytes())
    for seq, sig in ((9001, b""), (9002, b"\x30\x06\x02\x01\x01\x02\x01\x01")):
        batch = session_pb2.EventBatch(journal_id=t.journal_id, events=[forged_bound("n1", res, seq, sig)])
        await t.inject(NodeMessage(event_batch=batch))
    body = forged_bound("n1", res, 0, b"").report.body
    foreign = attest.sign(n2_key, attest.report_message(body))
    batch = session_pb2.EventBatch(journal_id=t.journal_id, events=[forged_bound("n1", res, 9003, foreign)])
    await t.inject(NodeMessage(event_batch=batch))

    whys = []
    for _ in range(3):
        ev = await lab.wait_event(
            "reservation.binding-rejected",
            lambda ev, d: ev.subject == "n1" and d["seq"] not in {w[0] for w in whys},
        )
        d = json.loads(ev.data_json)
        whys.append((d["seq"], d["why"]))
    assert sorted(whys) == [(9001, "unsigned"), (9002, "bad-signature"), (9003, "bad-signature")]
    await lab.wait_event("security.report-rejected", lambda ev, d: ev.subject == "n1" and d["seq"] == 9003)
    assert (await lab.admin.list_reservations(node_id="n1"))[0].state == "placed"


async def test_a_forged_report_about_an_active_binding_marks_it_lost_and_releases_nothing(lab: InprocLab) -> None:
    t = await start(lab)
    res = await lab.admin.reserve(1, node_id="n1")
    await lab.wait_event("reservation.active", lambda ev, d: ev.subject == res.id)

    batch = session_pb2.EventBatch(journal_id=t.journal_id, events=[forged_bound("n1", res, 9001, b"")])
    await t.inject(NodeMessage(event_batch=batch))
    lost = await lab.wait_event("reservation.lost", lambda ev, d: ev.subject == res.id)
    assert json.loads(lost.data_json)["reason"] == "forged-report:unsigned"
    now = (await lab.admin.list_reservations(node_id="n1"))[0]
    assert now.state == "lost" and len(now.devices) == 1  # still booked: nothing was released
    spec = json.loads((await lab.admin.get_spec("n1")).spec_json)
    assert spec["devices"]["assignments"][0]["allocation_id"] == res.allocation_id


async def test_an_attested_result_without_the_node_signature_changes_nothing(lab: InprocLab) -> None:
    t = await start(lab)

    # The gateway drops the node's real result and reports success itself.
    t.inbound = lambda m: None if m.HasField("command_update") else m
    info = await lab.admin.run_command("n1", "diag.nvml")
    await until(_journal_done(lab, "n1", info.id))
    forged = session_pb2.CommandUpdate(
        command_id=info.id, state=session_pb2.COMMAND_SUCCEEDED, result=b'{"gpus":[]}', node_sig=b""
    )
    await t.inject(NodeMessage(command_update=forged))
    sec = await security_event(lab, "security.result-rejected", "n1")
    assert sec == {"command_id": info.id, "kind": "diag.nvml", "state": "succeeded", "reason": "unsigned"}

    # A result "signed" by another key is refused the same way.
    await lab.join("n2")
    n2_key = keys.load_key_pem((lab.node_dir("n2") / "node.key").read_bytes())
    forged.node_sig = attest.sign(n2_key, attest.result_message(info.id, "COMMAND_SUCCEEDED", forged.result))
    await t.inject(NodeMessage(command_update=forged))
    await lab.wait_event(
        "security.result-rejected", lambda ev, d: ev.subject == "n1" and d["reason"] == "bad-signature"
    )
    assert (await lab.admin.get_command(info.id)).state not in ("succeeded", "failed")

    # Relaying honestly again: the node's own signed result settles it at the next Hello.
    t.inbound = None
    await lab.stop_node("n1")
    await lab.start_node("n1")
    done = await settled(lab, info.id, timeout=20)
    assert done["state"] == "succeeded"


# -- the time mark ----------------------------------------------------------------------------------


async def test_a_welcome_six_minutes_before_the_time_mark_is_refused(lab: InprocLab) -> None:
    t = await start(lab)
    agent = lab.agents["n1"]
    await until(lambda: agent.time_mark_ms > 0)

    def rewind(msg: GatewayMessage) -> GatewayMessage:
        if msg.HasField("welcome"):
            msg.welcome.server_time_ms = agent.time_mark_ms - 6 * 60 * 1000
        return msg

    t.outbound = rewind
    before = (await lab.admin.get_node("n1")).session_epoch
    await lab.stop_node("n1")
    agent = await lab.start_node("n1")
    # The rewound Welcome is refused: the node closes that session itself and never counts as welcomed.
    ev = await lab.wait_event(
        "node.connectivity",
        lambda ev, d: ev.subject == "n1" and d["state"] == "disconnected" and d["epoch"] > before,
    )
    assert not agent.connected.is_set()
    assert json.loads(ev.data_json)["epoch"] > before
    t.outbound = None
    await lab.wait_event(
        "node.connectivity", lambda ev, d: ev.subject == "n1" and d["state"] == "connected" and d["epoch"] > before + 1
    )
