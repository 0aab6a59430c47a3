"""agent.helper.tpm_ops: the TPM operations an unprivileged node may ask of the helper, checked before the TPM is
touched. The examples show each operation's rule; Hypothesis shows that no request names a handle outside the
helper's range or hands the TPM a blob of another size or shape."""

from __future__ import annotations

import base64
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.helper import ops, tpm_ops
from agent.helper.ops import Layout, Refused, TpmCall
from agent.tpm import HANDLES

LAY = Layout(Path("/h"))


def req(op: str, **args: Any) -> dict[str, Any]:
    return {"v": ops.VERSION, "op": op, **args}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def tpm2b(data: bytes) -> bytes:
    return struct.pack(">H", len(data)) + data


def id_object(hmac: int = 32, enc: int = 34) -> bytes:
    return tpm2b(tpm2b(b"h" * hmac) + b"e" * enc)


def one(request: dict[str, Any]) -> TpmCall:
    (effect,) = ops.plan(request, LAY)
    assert isinstance(effect, TpmCall)
    return effect


def test_a_key_is_named_by_its_slot_and_the_helper_picks_the_handle() -> None:
    assert one(req("tpm.key.create", slot=0)) == TpmCall("create", handle=HANDLES[0])
    assert one(req("tpm.key.public", slot=1)) == TpmCall("public", handle=HANDLES[1])
    assert one(req("tpm.key.certify", slot=1)).handle == HANDLES[1]
    assert one(req("tpm.key.evict", slot=0)).handle == HANDLES[0]
    assert one(req("tpm.ak.public")) == TpmCall("ak")
    assert one(req("tpm.ek.certificate")) == TpmCall("ek-certificate")


@pytest.mark.parametrize(
    "request_",
    [
        req("tpm.key.create", slot=2),
        req("tpm.key.create", slot=-1),
        req("tpm.key.create", slot=True),
        req("tpm.key.create", slot="0"),
        req("tpm.key.create"),
        req("tpm.key.create", slot=0, handle=0x81000001),
        req("tpm.key.public", slot=0, tcti="device:/dev/tpm0"),
        req("tpm.key.sign", slot=0, digest=b64(b"d" * 32), path="/etc/shadow"),
        req("tpm.ak.public", slot=0),
    ],
)
def test_a_handle_a_tcti_a_path_or_a_slot_outside_the_range_is_refused(request_: dict[str, Any]) -> None:
    with pytest.raises(Refused):
        ops.plan(request_, LAY)


def test_signing_takes_exactly_a_sha256_digest() -> None:
    assert one(req("tpm.key.sign", slot=0, digest=b64(b"d" * 32))) == TpmCall("sign", HANDLES[0], b"d" * 32)
    for bad in (b64(b"d" * 31), b64(b"d" * 33), b64(b""), "not base64!", "ZA"):
        with pytest.raises(Refused, match="digest"):
            ops.plan(req("tpm.key.sign", slot=0, digest=bad), LAY)


def test_an_activation_takes_an_id_object_and_an_encrypted_secret_of_their_shapes() -> None:
    call = one(req("tpm.credential.activate", credential=b64(id_object()), secret=b64(tpm2b(b"s" * 256))))
    assert call.action == "activate" and call.credential == id_object() and call.secret == tpm2b(b"s" * 256)
    bad = [
        (b64(id_object()[:-1]), b64(tpm2b(b"s" * 256)), "credential"),  # its size does not match
        (b64(id_object(hmac=7)), b64(tpm2b(b"s" * 256)), "HMAC"),  # not a digest's size
        (b64(tpm2b(tpm2b(b"h" * 32))), b64(tpm2b(b"s" * 256)), "nothing follows"),
        (b64(id_object(enc=200)), b64(tpm2b(b"s" * 256)), "credential"),  # over the bound
        (b64(id_object()), b64(tpm2b(b"s" * 513)), "secret"),  # an RSA key over 4096 bits
        (b64(id_object()), b64(b"\x01\x00" + b"s" * 255), "secret"),
    ]
    for credential, secret, match in bad:
        with pytest.raises(Refused, match=match):
            ops.plan(req("tpm.credential.activate", credential=credential, secret=secret), LAY)


def test_slot_of_knows_only_the_helpers_handles() -> None:
    assert [tpm_ops.slot_of(h) for h in HANDLES] == [0, 1]
    assert tpm_ops.slot_of(0x81000001) is None


blobs = st.binary(max_size=600).map(b64) | st.text(max_size=60) | st.integers() | st.none()
tpm_requests = st.fixed_dictionaries(
    {"v": st.just(ops.VERSION), "op": st.sampled_from([op for op in ops.TABLE if op.startswith("tpm.")])},
    optional={
        "slot": st.integers(-2, 3) | st.booleans() | st.text(max_size=3),
        "digest": blobs,
        "credential": blobs | st.builds(id_object, st.integers(0, 70), st.integers(0, 70)).map(b64),
        "secret": blobs | st.binary(max_size=520).map(lambda b: b64(tpm2b(b))),
    },
)


@given(tpm_requests)
@settings(max_examples=500, deadline=None)
def test_any_tpm_request_is_refused_or_one_call_on_the_helpers_handles_with_bounded_blobs(
    request: dict[str, Any],
) -> None:
    try:
        plan = ops.plan(request, LAY)
    except Refused as e:
        assert str(e).startswith(request["op"]) and "\n" not in str(e)
        return
    (call,) = plan
    assert isinstance(call, TpmCall)
    if request["op"].startswith("tpm.key."):
        assert call.handle == HANDLES[request["slot"]] and not isinstance(request["slot"], bool)
    else:
        assert call.handle == 0
    assert len(call.digest) in (0, tpm_ops.DIGEST_BYTES)
    assert len(call.credential) <= tpm_ops.MAX_ID_OBJECT and len(call.secret) <= tpm_ops.MAX_ENCRYPTED_SECRET
    if call.action == "activate":
        assert int.from_bytes(call.credential[:2], "big") == len(call.credential) - 2
        assert int.from_bytes(call.secret[:2], "big") == len(call.secret) - 2
