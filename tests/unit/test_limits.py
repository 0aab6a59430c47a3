"""The size table (bc.protocol.limits): its refusals, and what the table implies, checked on real messages.

Each implication is a promise some other module relies on: a node can always
send each result it holds, a gateway can always send a stored spec or command,
and the Admin replies that carry the largest single things fit the client's
receive limit.
"""

from __future__ import annotations

import base64

import pytest
from google.protobuf import any_pb2
from hypothesis import given
from hypothesis import strategies as st

from bc.errors import UsageError
from bc.protocol.limits import (
    FRAME_HEADROOM_BYTES,
    LIMITS,
    MIB,
    Limits,
    check_count,
    check_size,
    text_size,
    too_large,
    truncate_text,
)
from bc.protocol.pb import admin_pb2, common_pb2, session_pb2
from bc.protocol.pb.session_pb2 import GatewayMessage, NodeMessage

ULID = "01J9Z7Q6S0W8D4Y2N5K3H1G7FX"
NODE_ID = "n" * 128  # the longest node id the CA issues
BOOT_ID = "0b9c6f7e-5d4c-4b3a-9f8e-7d6c5b4a3f2e"


def maximal_update() -> session_pb2.CommandUpdate:
    """The largest update a current agent sends: every part at its limit, signed."""
    return session_pb2.CommandUpdate(
        command_id=ULID,
        state=session_pb2.COMMAND_SUCCEEDED,
        reason="r" * LIMITS.max_text_bytes,
        message="é" * (LIMITS.max_text_bytes // 2),
        result=b"x" * LIMITS.max_result_bytes,
        boot_id=BOOT_ID,
        node_sig=b"s" * 72,  # a DER ECDSA P-256 signature is at most 72 bytes
    )


def big_inventory(gpus: int = 16) -> common_pb2.Inventory:
    inv = common_pb2.Inventory(hostname="h" * 253, source="nvml", driver_version="550.54.15", cpus=256)
    for i in range(gpus):
        g = inv.gpus.add(index=i, uuid=f"GPU-{i:08x}-0000-0000-0000-000000000000", name="NVIDIA H100 80GB HBM3")
        g.pci_bus_id = "00000000:18:00.0"
        for j in range(7):
            g.mig_instances.add(uuid=f"MIG-{i:04x}{j:04x}-0000-0000-0000-000000000000", profile="1g.10gb")
    return inv


def test_grpc_limit_is_the_frame_plus_headroom_and_grpcs_own_default() -> None:
    assert LIMITS.grpc_message_bytes == LIMITS.max_frame_bytes + FRAME_HEADROOM_BYTES
    # gRPC's default receive limit: an agent or gateway of an older version accepts every frame we write.
    assert LIMITS.grpc_message_bytes == 4 * MIB
    assert dict(LIMITS.grpc_options()) == {
        "grpc.max_receive_message_length": 4 * MIB,
        "grpc.max_send_message_length": 4 * MIB,
    }


def test_the_largest_update_is_within_max_update_bytes() -> None:
    assert maximal_update().ByteSize() <= LIMITS.max_update_bytes


def test_a_hello_with_a_large_inventory_still_has_room_for_the_largest_update() -> None:
    hello = NodeMessage(
        hello=session_pb2.Hello(
            node_id=NODE_ID,
            boot_id=BOOT_ID,
            journal_id="j-" + "0" * 16,
            incarnation_id="0" * 16,
            capabilities=["devices.cdi", "devices.limits", "binding.kubernetes"],
            inventory_hash="sha256:" + "0" * 64,
            inventory=big_inventory(),
            running_command_ids=[ULID] * 32,
        )
    )
    hello.hello.unacked_results.append(maximal_update())
    assert hello.ByteSize() <= LIMITS.max_frame_bytes
    assert LIMITS.min_frame_bytes <= LIMITS.max_frame_bytes


def test_a_maximal_command_in_its_envelope_fits_a_frame() -> None:
    payload = any_pb2.Any(type_url="type.googleapis.com/bc.v1.DiagNvmlRequest", value=b"p" * LIMITS.max_payload_bytes)
    body = session_pb2.CommandBody(
        id=ULID,
        node_id=NODE_ID,
        seq=2**40,
        kind="diag.nvml",
        payload=payload,
        not_after_ms=2**45,
        idempotency_key="k" * 256,
        batch_id="b-" + ULID,
    )
    env = common_pb2.Envelope(
        purpose="command", body=body.SerializeToString(), key_id="sha256:" + "0" * 64, signature=b"s" * 64
    )
    env.cert_chain.append(b"c" * 2048)
    cmd = session_pb2.Command(envelope=env, attempt=99, batch_approval=b"a" * 64 * 1024, batch_proof=b"p" * 32 * 20)
    assert GatewayMessage(command=cmd).ByteSize() <= LIMITS.max_frame_bytes


def test_a_maximal_spec_in_its_envelope_fits_a_frame() -> None:
    env = common_pb2.Envelope(
        purpose="desired-state", body=b"b" * LIMITS.max_spec_bytes, key_id="sha256:" + "0" * 64, signature=b"s" * 64
    )
    env.cert_chain.append(b"c" * 2048)
    msg = GatewayMessage(desired_state=session_pb2.DesiredState(envelope=env))
    assert msg.ByteSize() <= LIMITS.max_frame_bytes


def test_the_admin_replies_carrying_the_largest_things_fit_the_clients_limit() -> None:
    spec = admin_pb2.SpecInfo(node_id=NODE_ID, generation=2**40, spec_hash="sha256:" + "0" * 64)
    spec.spec_json = "j" * LIMITS.max_spec_bytes
    assert spec.ByteSize() <= LIMITS.grpc_message_bytes

    # A result that is not JSON is shown as base64: a third larger.
    result_json = base64.b64encode(b"\xff" * LIMITS.max_result_bytes).decode()
    cmd = admin_pb2.CommandInfo(id=ULID, node_id=NODE_ID, kind="diag.nvml", state="succeeded")
    cmd.reason, cmd.message, cmd.result_json = "r" * LIMITS.max_text_bytes, "m" * LIMITS.max_text_bytes, result_json
    assert cmd.ByteSize() <= LIMITS.grpc_message_bytes

    batch = admin_pb2.BatchInfo(id="b-" + ULID, kind="gpu.reset", state="pending", scope_root="0" * 64)
    batch.payload_json = "p" * LIMITS.max_payload_bytes
    for i in range(LIMITS.max_batch_nodes):
        batch.leaves.add(
            index=i,
            node_id=NODE_ID,
            kind="gpu.reset",
            payload_digest="0" * 64,
            command_id=ULID,
            command_state="cancelled",
        )
    assert batch.ByteSize() <= LIMITS.grpc_message_bytes


def test_an_enqueue_commands_reply_of_the_most_commands_fits_a_frame() -> None:
    """Every command new (its key `cmd:<ULID>`), node ids at their longest, an operator name of 32: it fits.
    (With a 128-character operator name it would not: `commands.check_reply_size` refuses such a call whole.)"""
    reply = admin_pb2.EnqueueCommandsResponse()
    for i in range(LIMITS.max_enqueue_cmds):
        reply.commands.add(
            id=ULID,
            node_id=NODE_ID,
            kind="inventory.refresh",
            state="pending",
            seq=2**40 + i,
            lane="provision",
            idempotency_key="cmd:" + ULID,
            not_after_ms=2**42,
            min_generation=2**40,
            created_age_ms=2**20,
            updated_age_ms=2**20,
            requested_by="o" * 32,
            signer_key_id="sha256:" + "0" * 64,
            attested=True,
        )
    assert reply.ByteSize() <= LIMITS.max_frame_bytes


def test_a_refusal_names_the_size_the_limit_and_the_limits_name() -> None:
    with pytest.raises(UsageError) as e:
        check_size("the host section", 3 * MIB, "max_section_bytes")
    assert e.value.message == "the host section is 3,145,728 bytes; the limit is 262,144 bytes (max_section_bytes)"
    assert e.value.exit_code == 2
    check_size("the host section", LIMITS.max_section_bytes, "max_section_bytes")  # at the limit: fine
    assert too_large("x", LIMITS.max_section_bytes, "max_section_bytes") is None


def test_a_count_refusal_names_the_limit() -> None:
    with pytest.raises(UsageError) as e:
        check_count("the batch's node list", 10_001, "max_batch_nodes")
    assert e.value.message == "the batch's node list has 10,001; the limit is 10,000 (max_batch_nodes)"
    check_count("the batch's node list", 10_000, "max_batch_nodes")


def test_a_lowered_table_is_read_by_the_checks() -> None:
    small = Limits(max_payload_bytes=10)
    with pytest.raises(UsageError, match=r"is 11 bytes; the limit is 10 bytes \(max_payload_bytes\)"):
        check_size("the payload", 11, "max_payload_bytes", small)


@given(st.text(), st.integers(min_value=64, max_value=2000))
def test_truncated_text_fits_and_keeps_a_prefix(text: str, max_bytes: int) -> None:
    out = truncate_text(text, max_bytes)
    assert text_size(out) <= max_bytes
    if text_size(text) <= max_bytes:
        assert out == text
    else:
        head = out[: out.rindex("… [")]
        assert text.startswith(head)
        cut = text_size(text) - text_size(head)
        assert out.endswith(f"[{cut:,} bytes cut]")
