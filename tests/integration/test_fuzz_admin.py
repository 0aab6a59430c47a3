"""Fuzzing the Admin API of a real `bc serve` (gRPC, mutual TLS, SQLite file) with any request.

Every unary Admin call gets requests built from its descriptor
(`tests.strategies`): oversized and deeply nested text, control and bidi
characters, int64 boundaries, unknown enum numbers. Whatever the request,
the server

* answers, or refuses with one of the codes our error tree maps to an exit
  code for bad input or refused identity (never UNKNOWN, INTERNAL or
  UNAVAILABLE, which would mean it crashed or broke the contract);
* refuses in one sentence (non-empty details, one line, no traceback);
* stores nothing on a refusal (every table but the append-only events log,
  which may only gain a `security.*` record of the refusal); and
* still answers an ordinary call afterwards.

The server runs on a loop of the test module's own, so Hypothesis drives the
examples synchronously; the server's tasks run while each call is awaited.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from bc.protocol.pb import admin_pb2
from bc.wire.stubs import admin_pb2_grpc
from tests.integration.conftest import InprocLab, open_lab
from tests.strategies import messages

# What a refusal may be: bad input (exit 2), not found (3), conflict (4), refused identity or role (6),
# and gRPC's own refusal of a message over its limit, which the client maps to exit 2 with the limit named.
REFUSALS = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}

# Tables that move by themselves while the server runs (leases renewed by its workers).
# api_endpoints and gateway_endpoints: each api and gateway process re-registers its address, as a lease.
MOVING_TABLES = {"events", "leases", "api_endpoints", "gateway_endpoints"}

METHODS = [
    m
    for m in admin_pb2.DESCRIPTOR.services_by_name["Admin"].methods
    if not m.server_streaming and not m.client_streaming
]


@dataclass
class Fuzzed:
    loop: asyncio.AbstractEventLoop
    lab: InprocLab
    stub: Any

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def call(self, name: str, request: Message) -> Any:
        """One Admin call; the grpc.aio call object is made inside the loop, which it binds to."""

        async def go() -> Any:
            return await getattr(self.stub, name)(request, timeout=30)

        return self.run(go())


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzzed]:
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)  # grpc.aio looks the loop up when the channel is made
    cm = open_lab(Path(tmp_path_factory.mktemp("fuzz-admin")))
    lab: InprocLab = loop.run_until_complete(cm.__aenter__())
    try:
        loop.run_until_complete(lab.join("n1"))  # one real node, so requests naming it get further
        stub = admin_pb2_grpc.AdminStub(lab.admin._channel)  # the operator's own mTLS channel
        yield Fuzzed(loop, lab, stub)
    finally:
        loop.run_until_complete(cm.__aexit__(None, None, None))
        loop.run_until_complete(loop.shutdown_asyncgens())
        asyncio.set_event_loop(None)
        loop.close()


async def snapshot(lab: InprocLab) -> tuple[str, list[str]]:
    """A digest of every stored row outside the moving tables, and the event types logged so far."""
    store = lab.server.store
    h = hashlib.sha256()
    async with store.transaction(write=False) as tx:
        names = [
            str(r["name"])
            for r in await tx.fetchall("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        ]
        for name in names:
            if name in MOVING_TABLES or name.startswith("sqlite_"):
                continue
            for row in await tx.fetchall(f"SELECT * FROM {name}"):
                h.update(repr(sorted(dict(row).items())).encode())
        types = [str(r["type"]) for r in await tx.fetchall("SELECT type FROM events ORDER BY seq")]
    return h.hexdigest(), types


requests = st.sampled_from(METHODS).flatmap(
    lambda m: st.tuples(st.just(m.name), messages(m.input_type, depth=3, hostile=True))
)


# A failing example may carry a megabyte of text; hypothesis warns about printing it, and that warning
# (an error under our filterwarnings) must not hide the failure it is about to report.
@pytest.mark.filterwarnings("ignore:Generating overly large repr")
@settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
@given(call=requests)
# Once found by CI: the caller's kind "\n" came back inside the one-line refusal of an oversize payload.
@example(call=("CreateBatch", admin_pb2.CreateBatchRequest(kind="\n", node_ids=["n1"], payload_json="z" * 1_100_000)))
def test_the_admin_api_refuses_in_one_sentence_and_stores_nothing(fuzzed: Fuzzed, call: tuple[str, Message]) -> None:
    name, request = call
    before_digest, before_events = fuzzed.run(snapshot(fuzzed.lab))
    try:
        fuzzed.call(name, request)
        event(f"{name}: ok")
        return
    except grpc.aio.AioRpcError as e:
        code, details = e.code(), e.details() or ""
    event(f"{name}: {code.name}")
    assert code in REFUSALS, f"{name} failed {code.name}: {details[:300]!r}"
    assert details.strip(), f"{name} refused {code.name} without a word"
    assert "\n" not in details and "Traceback" not in details, f"{name}: {details[:300]!r}"
    after_digest, after_events = fuzzed.run(snapshot(fuzzed.lab))
    assert after_digest == before_digest, f"{name} refused {code.name} ({details[:200]!r}) yet changed the store"
    assert after_events[: len(before_events)] == before_events
    new = after_events[len(before_events) :]
    assert all(t.startswith("security.") for t in new), f"{name} refused yet logged {new}"


def test_the_server_still_answers_after_the_fuzzing(fuzzed: Fuzzed) -> None:
    info = fuzzed.call("ServerInfo", admin_pb2.ServerInfoRequest())
    assert info.ca_fingerprint
    nodes = fuzzed.call("ListNodes", admin_pb2.ListNodesRequest())
    assert any(n.node_id == "n1" for n in nodes.nodes)
