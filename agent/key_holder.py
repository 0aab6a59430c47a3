"""Where the node key lives, behind one small interface: a file (`node.key`, the default) or a TPM.

The agent signs with its node key (renewal and re-join proofs, attested results) and checks that the
key still matches its certificate; how depends on the attestor the node joined with:

* `FileNodeKey`: a P-256 key in `node.key` (0600), the one `bc join` generates;
* `agent.tpm.TpmNodeKey`: a key the TPM generated and keeps, `node.key` holding only a record of it.

Both are async: a TPM command is a subprocess, and the file key's reads go to a thread, so neither
blocks the event loop. `agent.tpm.open_node_key` picks the holder from what `node.key` holds.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from bc.errors import Unauthenticated
from bc.pki import attest, keys
from bc.pki.identity import make_csr
from bc.pki.tpm_attest import TpmCertification

KEY_MISMATCH = "the node key does not match the node certificate; join again: bc join --reset --yes, then bc join"


@dataclass(frozen=True)
class NextKey:
    """A renewal's next key, made by the holder: its CSR, the TPM's word for it, and what node.key becomes."""

    public_key: ec.EllipticCurvePublicKey
    csr_der: bytes
    stored: bytes  # node.key's next content: the key's PEM, or the TPM's record of it
    tpm: TpmCertification | None = None  # the AK's certification of a TPM-held next key


class NodeKeyHolder(Protocol):
    async def public_key(self) -> ec.EllipticCurvePublicKey: ...

    async def sign(self, message: bytes) -> bytes:
        """ECDSA-SHA256, DER-encoded."""
        ...

    async def check(self, cert: x509.Certificate) -> None:
        """Raise `Unauthenticated` (or `Unavailable`, retryable) in one sentence unless the key is `cert`'s."""
        ...

    async def next_key(self, node_id: str) -> NextKey:
        """A new key for a renewal or a re-join, where this holder keeps keys."""
        ...

    async def adopt(self, nxt: NextKey) -> None:
        """The next key is node.key's now (its certificate stored): forget the old one."""
        ...


class FileNodeKey:
    """The node key in a file, read again on each use (a renewal replaces the file)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    async def _key(self) -> ec.EllipticCurvePrivateKey:
        return keys.load_key_pem(await asyncio.to_thread(self.path.read_bytes))

    async def public_key(self) -> ec.EllipticCurvePublicKey:
        return (await self._key()).public_key()

    async def sign(self, message: bytes) -> bytes:
        return attest.sign(await self._key(), message)

    async def check(self, cert: x509.Certificate) -> None:
        if (await self.public_key()).public_numbers() != _ec(cert.public_key()).public_numbers():
            raise Unauthenticated(KEY_MISMATCH)

    async def next_key(self, node_id: str) -> NextKey:
        key = keys.generate_key()
        csr_der = make_csr(key, node_id).public_bytes(serialization.Encoding.DER)
        return NextKey(key.public_key(), csr_der, keys.key_to_pem(key))

    async def adopt(self, nxt: NextKey) -> None:
        return None  # the file itself was replaced: nothing else held the old key


def _ec(key: object) -> ec.EllipticCurvePublicKey:
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise Unauthenticated("the certificate's key is not an ECDSA key")
    return key
