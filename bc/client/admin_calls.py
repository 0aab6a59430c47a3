"""The Admin service's calls on one channel, each made the first time it is used.

The generated `AdminStub` is a 100 KB module whose constructor makes all 59
multicallables; importing and building it was about 4 ms of a one-shot CLI
call that makes one. `AdminCalls` makes a call from the service's descriptor
exactly as the stub does (the same path, the same serializer and
deserializer, `_registered_method=True`);
tests/unit/cli/test_admin_calls.py compares the two for every method.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import message_factory
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor

from bc.protocol.pb import admin_pb2

ADMIN: ServiceDescriptor = admin_pb2.DESCRIPTOR.services_by_name["Admin"]


class AdminCalls:
    """`calls["ListNodes"]`: the channel's multicallable for that method, made once."""

    def __init__(self, channel: Any) -> None:
        self._channel = channel
        self._made: dict[str, Any] = {}

    def __getitem__(self, rpc: str) -> Any:
        call = self._made.get(rpc)
        if call is None:
            call = self._made[rpc] = make_call(self._channel, ADMIN.methods_by_name[rpc])
        return call


def make_call(channel: Any, method: MethodDescriptor) -> Any:
    """What the generated stub's constructor makes for `method` on `channel` (a grpc or grpc.aio channel)."""
    request = message_factory.GetMessageClass(method.input_type)
    reply = message_factory.GetMessageClass(method.output_type)
    shape = {
        (False, False): channel.unary_unary,
        (False, True): channel.unary_stream,
        (True, False): channel.stream_unary,
        (True, True): channel.stream_stream,
    }[(method.client_streaming, method.server_streaming)]
    return shape(
        f"/{method.containing_service.full_name}/{method.name}",
        request_serializer=request.SerializeToString,
        response_deserializer=reply.FromString,
        _registered_method=True,
    )
