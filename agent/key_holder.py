"""Where the node key lives, behind one small interface: a file (`node.key`, the default) or a TPM.

The agent signs with its node key (renewal and re-join proofs, attested results) and checks that the
key still matches its certificate; how depends on the attestor the node joined with:

* `FileNodeKey`: a P-256 key in `node.key` (0600), the one `bc join` generates;
* `agent.tpm.TpmNodeKey`: a key the TPM generated and keeps, `node.key` holding only a record of it.

Both are async: a TPM command is a subprocess, and the file key's reads go to a thread, so neither
blocks the event loop. `open_node_key` picks the holder from what `node.key` holds.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Protocol

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from bc.errors import Unauthenticated
from bc.pki import attest, keys

KEY_MISMATCH = "the node key does not match the node certificate; join again: bc join --reset --yes, then bc join"


class NodeKeyHolder(Protocol):
    async def public_key(self) -> ec.EllipticCurvePublicKey: ...

    async def sign(self, message: bytes) -> bytes:
        """ECDSA-SHA256, DER-encoded."""
        ...

    async def check(self, cert: x509.Certificate) -> None:
        """Raise `Unauthenticated` (or `Unavailable`, retryable) in one sentence unless the key is `cert`'s."""
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


async def open_node_key(path: Path, tcti: str | None = None) -> NodeKeyHolder:
    """The holder `path` (node.key) calls for: a TPM record opens the TPM (`tcti`, or the kernel's), else a file."""
    from agent.tpm import DEFAULT_TCTI, Tpm, TpmNodeKey, TpmRecord

    data = await asyncio.to_thread(path.read_bytes)
    if TpmRecord.is_record(data):
        return TpmNodeKey(Tpm(tcti or DEFAULT_TCTI), TpmRecord.load(data))
    return FileNodeKey(path)


def _ec(key: object) -> ec.EllipticCurvePublicKey:
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise Unauthenticated("the certificate's key is not an ECDSA key")
    return key
