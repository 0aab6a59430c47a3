"""Carrying out the helper's TPM operations (agent.helper.tpm_ops) on the helper's own TPM, as root.

The TPM is `agent.tpm.Tpm` at the helper's `--tcti` (tpm2-tools, one sequence at a time under its lock); the
answers are blobs, base64. A TPM that does not answer or refuses the command is an `EffectFailed` with the
TPM's sentence, which the node gets as `helper: tpm.… failed: …` (an OSError: retried where a TPM error is).
"""

from __future__ import annotations

import base64
from typing import Any

from agent.helper.plans import TpmCall
from agent.tpm import Tpm
from bc.errors import BcError


class TpmFailed(OSError):
    """The TPM did not answer, or refused the command."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def carry(effect: TpmCall, tpm: Tpm) -> dict[str, Any]:
    try:
        return await _carry(effect, tpm)
    except BcError as e:
        raise TpmFailed(e.message) from None


async def _carry(effect: TpmCall, tpm: Tpm) -> dict[str, Any]:
    action, handle = effect.action, effect.handle
    if action == "ak":
        return {"public": _b64((await tpm.attestation_public()).tpm2b)}
    if action == "create":
        return {"public": _b64((await tpm.create_key(handle)).tpm2b)}
    if action == "public":
        public = await tpm.read_public(handle)
        return {"public": _b64(public.tpm2b) if public is not None else None}
    if action == "sign":
        return {"signature": _b64(await tpm.sign_digest(handle, effect.digest))}
    if action == "certify":
        c = await tpm.certify(handle)
        return {"public": _b64(c.tpm2b_public), "attest": _b64(c.attest), "signature": _b64(c.signature)}
    if action == "evict":
        return {"evicted": await tpm.evict(handle)}
    if action == "ek-certificate":
        cert = await tpm.ek_certificate()
        return {"certificate": _b64(cert) if cert is not None else None}
    if action == "activate":
        return {"secret": _b64(await tpm.activate_credential(effect.credential, effect.secret))}
    raise TpmFailed(f"no TPM action {action!r}")
