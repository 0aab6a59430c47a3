"""The helper's TPM operations over a real unix socket, with the TPM faked at its edge (keys `cryptography` holds,
laid out as a TPM's by tests.soft_ak): the agent's `TpmNodeKey` runs over `HelperTpm` exactly as over a TPM, a TPM
operation does not wait behind the helper's other operations, and a TPM that refuses or does not answer comes back
as a `helper:` error. tests/integration/test_tpm_helper.py runs the same against swtpm, as root and a user."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, utils

from agent.helper.client import HelperClient, HelperError, HelperRefused
from agent.helper.node_tpm import HelperTpm
from agent.helper.ops import Layout
from agent.helper.server import HelperServer
from agent.tpm import HANDLES, UNAVAILABLE, Certified, Tpm, TpmNodeKey, TpmUnavailable
from bc.errors import BcError
from bc.pki import attest
from bc.pki.tpm_attest import TpmPublic, ak_uri, parse_public
from tests.soft_ak import certify, tpm2b_public


class MemoryTpm(Tpm):
    """A TPM at the hardware edge: an AK and keys at handles, in memory."""

    def __init__(self) -> None:
        super().__init__("memory:")
        self.ak = ec.generate_private_key(ec.SECP256R1())
        self.keys: dict[int, ec.EllipticCurvePrivateKey] = {}
        self.fail: BcError | None = None

    def _check(self) -> None:
        if self.fail is not None:
            raise self.fail

    async def attestation_public(self) -> TpmPublic:
        self._check()
        return parse_public(tpm2b_public(self.ak.public_key(), 0x00050472))

    async def create_key(self, handle: int) -> TpmPublic:
        self._check()
        self.keys[handle] = ec.generate_private_key(ec.SECP256R1())
        return parse_public(tpm2b_public(self.keys[handle].public_key()))

    async def read_public(self, handle: int) -> TpmPublic | None:
        self._check()
        key = self.keys.get(handle)
        return parse_public(tpm2b_public(key.public_key())) if key is not None else None

    async def sign_digest(self, handle: int, digest: bytes) -> bytes:
        self._check()
        return self.keys[handle].sign(digest, ec.ECDSA(utils.Prehashed(hashes.SHA256())))

    async def certify(self, handle: int) -> Certified:
        self._check()
        c = certify(self.ak, self.keys[handle].public_key())
        return Certified(handle, parse_public(c.key_public), c.key_public, c.attest, c.signature)

    async def evict(self, handle: int) -> bool:
        self._check()
        return self.keys.pop(handle, None) is not None


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[HelperServer, MemoryTpm, HelperTpm]]:
    tpm = MemoryTpm()
    helper = HelperServer(Layout(tmp_path / "root"), os.getuid(), tpm=tpm)
    server = await helper.start(tmp_path / "h.sock")
    async with server:
        yield helper, tpm, HelperTpm(HelperClient(tmp_path / "h.sock"))
    server.close()
    await server.wait_closed()


async def test_a_node_key_lives_its_life_through_the_helper(
    served: tuple[HelperServer, MemoryTpm, HelperTpm],
) -> None:
    _, tpm, remote = served
    key = await TpmNodeKey.create(remote, HANDLES[1])
    assert key.record.handle == HANDLES[1] and key.record.ak_uri == ak_uri(tpm.ak.public_key())
    public = await key.public_key()
    assert attest.verify(public, b"m", await key.sign(b"m"))
    nxt = await key.next_key("n1")
    assert nxt.tpm is not None and HANDLES[0] in tpm.keys
    await key.adopt(nxt)
    assert list(tpm.keys) == [HANDLES[0]]  # the old handle evicted
    assert await remote.read_public(HANDLES[1]) is None and await remote.evict(HANDLES[1]) is False


async def test_a_tpm_operation_does_not_wait_behind_the_helpers_other_operations(
    served: tuple[HelperServer, MemoryTpm, HelperTpm],
) -> None:
    helper, tpm, remote = served
    tpm.keys[HANDLES[0]] = ec.generate_private_key(ec.SECP256R1())
    async with helper._lock, asyncio.timeout(10):  # a package install, say, holds the helper
        signature = await remote.sign(HANDLES[0], b"m")
    assert attest.verify(tpm.keys[HANDLES[0]].public_key(), b"m", signature)


async def test_a_tpm_that_refuses_or_does_not_answer_is_a_helper_error_and_a_foreign_handle_is_never_sent(
    served: tuple[HelperServer, MemoryTpm, HelperTpm],
) -> None:
    _, tpm, remote = served
    tpm.keys[HANDLES[0]] = ec.generate_private_key(ec.SECP256R1())
    tpm.fail = BcError("the TPM refused tpm2_sign: ERROR: Esys_Sign(0x98e)")
    with pytest.raises(HelperRefused, match=r"^helper: tpm.key.sign failed: the TPM refused tpm2_sign"):
        await remote.sign(HANDLES[0], b"m")
    tpm.fail = TpmUnavailable(f"{UNAVAILABLE} (device:/dev/tpmrm0: no such file)")
    with pytest.raises(HelperError, match=r"^helper: tpm.ak.public failed: .* which is unavailable"):
        await remote.attestation_key()
    with pytest.raises(HelperRefused, match=r"^helper: the node key's handle 0x81000001 is not one of the helper's"):
        await remote.read_public(0x81000001)


async def test_a_helper_without_a_tpm_says_so(tmp_path: Path) -> None:
    server = await HelperServer(Layout(tmp_path / "root"), os.getuid()).start(tmp_path / "h.sock")
    async with server:
        with pytest.raises(HelperRefused, match=r"^helper: tpm.ak.public failed: this helper has no TPM$"):
            await HelperTpm(HelperClient(tmp_path / "h.sock")).attestation_key()
    server.close()
    await asyncio.wait_for(server.wait_closed(), 10)
