"""The helper's TPM operations: what an unprivileged node asks of the TPM it may not open. Pure, no I/O.

The node key of `bc join --attestor tpm` lives in the TPM (agent.tpm); `/dev/tpmrm0` is root's (or group
`tss`'s), so an unprivileged `bc node` asks the helper, which runs tpm2-tools on its own TPM (`bc helper --tcti`).
No request names a handle, a TCTI or a file: a key's persistent handle is the helper's, chosen from its fixed
range (`agent.tpm.HANDLES`) by a slot number, and every blob in and out is bounded and checked for its shape.

    op                       arguments                        as root (answers)
    tpm.ak.public            -                                the attestation key's TPM2B_PUBLIC
    tpm.key.create           slot (0|1)                       a new node key at that slot's handle (evicting what was
                                                              there): its TPM2B_PUBLIC
    tpm.key.public           slot                             that key's TPM2B_PUBLIC, or null (the handle is empty)
    tpm.key.sign             slot, digest (32 bytes, base64)  ECDSA over that SHA-256 digest, DER
    tpm.key.certify          slot                             TPM2_Certify of that key by the AK: its TPM2B_PUBLIC,
                                                              the TPMS_ATTEST and the AK's signature
    tpm.key.evict            slot                             remove that key (answers whether there was one)
    tpm.ek.certificate       -                                the RSA EK's certificate from its NV index, or null
    tpm.credential.activate  credential (TPM2B_ID_OBJECT),    TPM2_ActivateCredential with the AK and the EK: the
                             secret (TPM2B_ENCRYPTED_SECRET)  secret a server sealed to them

Signing takes a digest, never the message: 32 bytes whatever the node signs. The effects are `TpmCall`s,
carried out by `agent.helper.tpm_effects` under the TPM's own lock (a TPM runs one sequence at a time).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

from agent.helper.plans import Layout, Plan, Planner, Refused, TpmCall, arg_int, arg_str
from agent.tpm import HANDLES

DIGEST_BYTES = 32
MAX_ID_OBJECT = 2 + (2 + 64) + (2 + 64)
"""A TPM2B_ID_OBJECT: its size, then an HMAC (at most SHA-512's 64 bytes) and the encrypted TPM2B_DIGEST."""
MAX_ENCRYPTED_SECRET = 2 + 512
"""A TPM2B_ENCRYPTED_SECRET: its size, then the seed encrypted to an RSA key of at most 4096 bits."""


def handle_of(slot: int) -> int:
    return HANDLES[slot]


def slot_of(handle: int) -> int | None:
    """The slot of one of the helper's handles; None for any other handle."""
    return HANDLES.index(handle) if handle in HANDLES else None


def _slot(req: Mapping[str, Any]) -> int:
    return handle_of(arg_int(req, "slot", 0, len(HANDLES) - 1))


def _blob(req: Mapping[str, Any], key: str, limit: int) -> bytes:
    text = arg_str(req, key, limit=4 * ((limit + 2) // 3))
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise Refused(f"{key} is not base64") from None
    if len(data) > limit:
        raise Refused(f"{key} is {len(data)} bytes, over {limit}")
    return data


def _tpm2b(data: bytes, key: str) -> None:
    """A TPM2B: a big-endian 2-byte size, then exactly that many bytes, at least one."""
    if len(data) < 3 or int.from_bytes(data[:2], "big") != len(data) - 2:
        raise Refused(f"{key} is not a TPM2B (its size, then that many bytes)")


def check_id_object(data: bytes) -> None:
    """A TPM2B_ID_OBJECT as MakeCredential makes it: a TPM2B_DIGEST (the outer HMAC), then the encrypted credential."""
    _tpm2b(data, "credential")
    hmac_size = int.from_bytes(data[2:4], "big") if len(data) >= 4 else 0
    if hmac_size not in (20, 32, 48, 64) or len(data) <= 4 + hmac_size:
        raise Refused("credential's integrity HMAC is not a digest's size, or nothing follows it")


def _none(action: str) -> Planner:
    return lambda req, lay: (TpmCall(action),)


def _keyed(action: str) -> Planner:
    return lambda req, lay: (TpmCall(action, handle=_slot(req)),)


def _sign(req: Mapping[str, Any], lay: Layout) -> Plan:
    handle = _slot(req)
    digest = _blob(req, "digest", DIGEST_BYTES)
    if len(digest) != DIGEST_BYTES:
        raise Refused(f"digest is {len(digest)} bytes, not a SHA-256 digest's {DIGEST_BYTES}")
    return (TpmCall("sign", handle=handle, digest=digest),)


def _activate(req: Mapping[str, Any], lay: Layout) -> Plan:
    credential = _blob(req, "credential", MAX_ID_OBJECT)
    check_id_object(credential)
    secret = _blob(req, "secret", MAX_ENCRYPTED_SECRET)
    _tpm2b(secret, "secret")
    return (TpmCall("activate", credential=credential, secret=secret),)


TABLE: dict[str, tuple[frozenset[str], Planner]] = {
    "tpm.ak.public": (frozenset(), _none("ak")),
    "tpm.key.create": (frozenset({"slot"}), _keyed("create")),
    "tpm.key.public": (frozenset({"slot"}), _keyed("public")),
    "tpm.key.sign": (frozenset({"slot", "digest"}), _sign),
    "tpm.key.certify": (frozenset({"slot"}), _keyed("certify")),
    "tpm.key.evict": (frozenset({"slot"}), _keyed("evict")),
    "tpm.ek.certificate": (frozenset(), _none("ek-certificate")),
    "tpm.credential.activate": (frozenset({"credential", "secret"}), _activate),
}
