"""`AdminCalls` makes each Admin call as the generated stub does, for every method of the service."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest

from bc.client.admin import WRITE_CHECKS, AdminClient
from bc.client.admin_calls import ADMIN, AdminCalls
from bc.errors import Unavailable
from bc.runtime.config import OperatorConfig
from bc.wire.stubs import admin_pb2_grpc

# What the generated stub's constructor gives each multicallable: grpc.aio keeps them as attributes.
SHAPE = ("_method", "_request_serializer", "_response_deserializer", "_registered_call_handle")


def shape(call: Any) -> tuple[object, ...]:
    return (type(call), *(getattr(call, name) for name in SHAPE))


def test_every_method_is_made_as_the_generated_stub_makes_it() -> None:
    async def go() -> None:
        channel = grpc.aio.insecure_channel("127.0.0.1:1")  # never dialled: a multicallable connects on use
        try:
            stub: Any = admin_pb2_grpc.AdminStub(channel)
            calls = AdminCalls(channel)
            for method in ADMIN.methods:
                assert shape(calls[method.name]) == shape(getattr(stub, method.name)), method.name
                assert calls[method.name] is calls[method.name]  # made once
        finally:
            await channel.close()

    asyncio.run(go())
    assert len(ADMIN.methods) > 50


def test_a_name_the_service_does_not_have_is_a_key_error() -> None:
    with pytest.raises(KeyError):
        AdminCalls(None)["NoSuchCall"]


def test_every_write_the_client_names_a_check_for_is_a_method() -> None:
    assert set(WRITE_CHECKS) <= {m.name for m in ADMIN.methods}


def test_the_client_outside_its_context_says_so() -> None:
    config = OperatorConfig(server="127.0.0.1:1", ca_pem=b"", cert_pem=b"", key_pem=b"", data_dir="", path=Path("x"))
    with pytest.raises(RuntimeError, match="outside `async with`"):
        asyncio.run(AdminClient(config).list_nodes())


def test_the_client_after_its_context_is_a_server_not_answering() -> None:
    """A caller that kept the client past its close (a TUI screen mid-read as the feed reconnects) is told the
    server is not answering (exit 5, retried), not a RuntimeError that stopped `bc tui`."""
    config = OperatorConfig(server="127.0.0.1:1", ca_pem=b"", cert_pem=b"", key_pem=b"", data_dir="", path=Path("x"))

    async def after_close() -> None:
        async with AdminClient(config) as client:
            pass
        await client.list_nodes()

    with pytest.raises(Unavailable, match=r"127\.0\.0\.1:1 is not answering"):
        asyncio.run(after_close())


def _rpc_error(details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


class _Flaky:
    """A unary method that fails with `errors` in turn, then answers."""

    def __init__(self, *errors: grpc.aio.AioRpcError) -> None:
        self.errors = list(errors)
        self.sent = 0

    async def __call__(self, request: Any, timeout: float) -> str:
        self.sent += 1
        if self.errors:
            raise self.errors.pop(0)
        return "answer"


_NEVER_CONNECTED = "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Handshake read failed"


def test_a_call_whose_connection_was_never_made_is_sent_again() -> None:
    config = OperatorConfig(server="127.0.0.1:1", ca_pem=b"", cert_pem=b"", key_pem=b"", data_dir="", path=Path("x"))
    method = _Flaky(_rpc_error(_NEVER_CONNECTED), _rpc_error(_NEVER_CONNECTED))
    assert asyncio.run(AdminClient(config)._sent(method, None, 1.0)) == "answer"  # type: ignore[arg-type]
    assert method.sent == 3


def test_connection_failures_past_the_retries_and_broken_calls_are_not_sent_again() -> None:
    config = OperatorConfig(server="127.0.0.1:1", ca_pem=b"", cert_pem=b"", key_pem=b"", data_dir="", path=Path("x"))
    always = _Flaky(*[_rpc_error(_NEVER_CONNECTED)] * 5)
    with pytest.raises(grpc.aio.AioRpcError):
        asyncio.run(AdminClient(config)._sent(always, None, 1.0))  # type: ignore[arg-type]
    assert always.sent == 3
    broken = _Flaky(_rpc_error("Socket closed"))  # reached the server: a write may have been applied
    with pytest.raises(grpc.aio.AioRpcError):
        asyncio.run(AdminClient(config)._sent(broken, None, 1.0))  # type: ignore[arg-type]
    assert broken.sent == 1
