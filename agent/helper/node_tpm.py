"""The node's TPM through `bc helper` (its `tpm.*` operations, agent.helper.tpm_ops): an unprivileged node.

`HelperTpm` is the helper-backed `agent.tpm.TpmDevice`; `TpmNodeKey`, `bc join --attestor tpm` and `bc doctor`
run the same code above it as above the direct `agent.tpm.Tpm`. The agent names a key by its persistent handle
(node.key's record); the helper is asked by the handle's slot in its own range, and refuses anything else. A
signature is asked for a SHA-256 digest, made here. Every failure is a `HelperError` (`helper: …`, an OSError):
the renewal and the session key retry it, as they retry a TPM that does not answer.

`open_tpm` is the one place that chooses: the helper when the node runs with `--helper-socket`, else tpm2-tools
at `--tcti` (as root, or in tests).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec

from agent.helper.client import HelperClient, HelperRefused
from agent.helper.tpm_ops import slot_of
from agent.tpm import DEFAULT_TCTI, Certified, Tpm, TpmDevice
from bc.pki.tpm_attest import TpmPublic, parse_public


class HelperTpm:
    """The TPM the helper holds (`bc helper --tcti`), asked one typed operation at a time."""

    def __init__(self, client: HelperClient) -> None:
        self.client = client

    @property
    def where(self) -> str:
        return f"bc helper at {self.client.socket_path}"

    async def attestation_key(self) -> ec.EllipticCurvePublicKey:
        return (await self.attestation_public()).key

    async def attestation_public(self) -> TpmPublic:
        return parse_public(_blob(await self.client.call("tpm.ak.public"), "public"))

    async def create_key(self, handle: int) -> TpmPublic:
        return parse_public(_blob(await self.client.call("tpm.key.create", slot=_slot(handle)), "public"))

    async def read_public(self, handle: int) -> TpmPublic | None:
        result = await self.client.call("tpm.key.public", slot=_slot(handle))
        return None if result.get("public") is None else parse_public(_blob(result, "public"))

    async def sign(self, handle: int, message: bytes) -> bytes:
        digest = base64.b64encode(hashlib.sha256(message).digest()).decode()
        return _blob(await self.client.call("tpm.key.sign", slot=_slot(handle), digest=digest), "signature")

    async def certify(self, handle: int) -> Certified:
        result = await self.client.call("tpm.key.certify", slot=_slot(handle))
        tpm2b = _blob(result, "public")
        return Certified(handle, parse_public(tpm2b), tpm2b, _blob(result, "attest"), _blob(result, "signature"))

    async def evict(self, handle: int) -> bool:
        return bool((await self.client.call("tpm.key.evict", slot=_slot(handle))).get("evicted"))

    async def ek_certificate(self) -> bytes | None:
        result = await self.client.call("tpm.ek.certificate")
        return None if result.get("certificate") is None else _blob(result, "certificate")

    async def activate_credential(self, credential: bytes, secret: bytes) -> bytes:
        result = await self.client.call(
            "tpm.credential.activate",
            credential=base64.b64encode(credential).decode(),
            secret=base64.b64encode(secret).decode(),
        )
        return _blob(result, "secret")


def _slot(handle: int) -> int:
    slot = slot_of(handle)
    if slot is None:
        raise HelperRefused(f"helper: the node key's handle 0x{handle:08x} is not one of the helper's")
    return slot


def _blob(result: dict[str, Any], key: str) -> bytes:
    try:
        return base64.b64decode(str(result[key]), validate=True)
    except (KeyError, binascii.Error, ValueError):
        raise HelperRefused(f"helper: the answer has no {key}") from None


def open_tpm(helper_socket: Path | None, tcti: str | None) -> TpmDevice:
    """The node's TPM: through the helper at `helper_socket`, else tpm2-tools at `tcti` (the kernel's by default)."""
    if helper_socket is not None:
        return HelperTpm(HelperClient(helper_socket))
    return Tpm(tcti or DEFAULT_TCTI)
