"""The node key inside a TPM (`bc join --attestor tpm`), through the `tpm2-tools` CLI.

What lives where:

* the node key: a P-256 signing key the TPM generates under the owner hierarchy's storage primary and
  keeps at a persistent handle (`tpm2_evictcontrol`); it is fixedTPM, so its private half never leaves
  the TPM, and no file holds it. `node.key` holds a record instead (JSON: the handle, the key's
  SubjectPublicKeyInfo and the AK URI), which says which key to use and what it must be;
* the attestation key (AK): a restricted P-256 signing primary of the endorsement hierarchy, derived
  again on each use from the endorsement seed, so the same TPM always gives the same AK. The node's
  certificate names it (`urn:bc:tpm-ak:…`, `bc.pki.tpm_attest.ak_uri`);
* a next key (renewal): created at the other of two persistent handles and certified by the AK
  (`TPM2_Certify`), which proves it lives in the same TPM; once the new certificate is stored, the old
  handle is evicted.

The failure modes of `docs/node-security.md` (and the reference's "TPM cleared or unavailable"):

* the TPM cannot be reached: `Unavailable` (a retry can help) with `UNAVAILABLE`;
* the TPM's AK is not the certificate's (another TPM, or its endorsement seed changed): `ANOTHER_AK`;
* the TPM no longer holds the recorded key (a `TPM2_Clear` evicts owner-hierarchy persistent keys and
  replaces the owner seed; the endorsement seed, and so the AK, stays): `CLEARED`. The recovery is
  `bc join --reset --yes --attestor tpm`, which moves the old identity and journal aside.

Who runs the commands is behind `TpmDevice`: `Tpm` (this module) runs them itself, as root or in tests; an
unprivileged node asks `bc helper`'s `tpm.*` operations instead (`agent.helper.node_tpm.HelperTpm`), and the
helper runs `Tpm` as root. `TpmNodeKey` and `bc join --attestor tpm` are the same code above either.

Every TPM command is an asyncio subprocess (never a blocking call on the loop), one at a time per TPM
(`_lock`: a TPM runs one command at a time, and without a resource manager, as with `swtpm`, the
transient objects one sequence loads must be flushed before the next). Where a kernel resource
manager is in front (`/dev/tpmrm0`), the flushes find nothing to flush.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from agent.key_holder import FileNodeKey, NextKey, NodeKeyHolder
from bc.errors import BcError, Unauthenticated, Unavailable
from bc.pki.remote_csr import make_remote_csr
from bc.pki.tpm_attest import AK_URI_PREFIX, TpmCertification, TpmPublic, ak_uri, parse_public, spki

DEFAULT_TCTI = "device:/dev/tpmrm0"
HANDLES = (0x81010042, 0x81010043)  # the current key and the next one take turns
NODE_KEY_ATTRS = "fixedtpm|fixedparent|sensitivedataorigin|userwithauth|sign|noda"
AK_ATTRS = "fixedtpm|fixedparent|sensitivedataorigin|userwithauth|restricted|sign|noda"
TOOL_TIMEOUT_S = 60.0

UNAVAILABLE = "the certificate's node key is in the TPM, which is unavailable"
ANOTHER_AK = (
    "this TPM's attestation key is not the one the certificate names (another TPM, or its endorsement seed"
    " changed): the certificate cannot be renewed here; join again: bc join --reset --yes, then bc join"
)
CLEARED = (
    "the node key does not match the node certificate: the TPM no longer holds the key node.key names (was the"
    " TPM cleared?); join again with the TPM: bc join --reset --yes --attestor tpm"
)

# Words of the TSS and tpm2-tools when no TPM answered (as opposed to a TPM that refused a command).
_UNREACHABLE_HINTS = ("tcti", "connection refused", "could not connect", "no such file", "failed to initialize")
# A handle that holds nothing: TPM_RC_HANDLE (0x18b) or TPM_RC_REFERENCE_H0 (0x910).
_NO_HANDLE_HINTS = ("0x18b", "0x18B", "0x910", "handle is not correct", "does not reference")


class TpmUnavailable(Unavailable):
    """No TPM answered; the renewal retries with back-off."""


@dataclass(frozen=True)
class TpmRecord:
    """What `node.key` holds for a TPM key: never the key, only where it is and what it must be."""

    handle: int
    public_spki_hex: str
    ak_uri: str

    def dump(self) -> bytes:
        doc = {"attestor": "tpm", "handle": f"0x{self.handle:08x}", "public": self.public_spki_hex, "ak": self.ak_uri}
        return (json.dumps(doc, indent=2) + "\n").encode()

    @staticmethod
    def load(data: bytes) -> TpmRecord:
        try:
            doc = json.loads(data)
            if doc.get("attestor") != "tpm":
                raise ValueError("not a TPM record")
            return TpmRecord(int(str(doc["handle"]), 16), str(doc["public"]), str(doc["ak"]))
        except (ValueError, KeyError, TypeError, AttributeError):
            raise Unauthenticated("node.key is not a TPM key record; join again: bc join --reset --yes") from None

    @staticmethod
    def is_record(data: bytes) -> bool:
        return data.lstrip().startswith(b"{")


@dataclass(frozen=True)
class Certified:
    """A next key and the AK's word that it lives in this TPM (what a renewal sends)."""

    handle: int
    public: TpmPublic
    tpm2b_public: bytes
    attest: bytes
    signature: bytes


class TpmDevice(Protocol):
    """What the node asks of its TPM, whoever runs the commands: `Tpm` (tpm2-tools in this process: as root, or
    in tests) or `agent.helper.node_tpm.HelperTpm` (the root helper's `tpm.*` operations: an unprivileged node).
    `TpmNodeKey`, `bc join --attestor tpm` and `bc doctor` run the same code above either."""

    @property
    def where(self) -> str:
        """How this TPM is reached, for a sentence (its TCTI, or the helper's socket)."""
        ...

    async def attestation_key(self) -> ec.EllipticCurvePublicKey: ...

    async def attestation_public(self) -> TpmPublic:
        """The AK's public area (its TPM name is what a credential activation is sealed to)."""
        ...

    async def create_key(self, handle: int) -> TpmPublic:
        """A new node key at `handle` (one of `HANDLES`; whatever was there is evicted first)."""
        ...

    async def read_public(self, handle: int) -> TpmPublic | None:
        """The key at `handle`, or None when the handle holds nothing (a cleared TPM)."""
        ...

    async def sign(self, handle: int, message: bytes) -> bytes:
        """ECDSA-SHA256 by the key at `handle`, DER-encoded."""
        ...

    async def certify(self, handle: int) -> Certified:
        """The AK's certification of the key at `handle` (`TPM2_Certify`)."""
        ...

    async def evict(self, handle: int) -> bool:
        """Remove the key at `handle`; False when it held none."""
        ...

    async def ek_certificate(self) -> bytes | None:
        """The endorsement key's certificate (DER) from the TPM's NV index for the RSA 2048 EK, or None."""
        ...

    async def activate_credential(self, credential: bytes, secret: bytes) -> bytes:
        """`TPM2_ActivateCredential` with the AK and the EK: the secret a server's MakeCredential sealed to this
        TPM's EK for this TPM's AK (`credential`: a TPM2B_ID_OBJECT, `secret`: a TPM2B_ENCRYPTED_SECRET)."""
        ...


EK_CERT_RSA_INDEX = 0x01C00002
"""The NV index of the RSA 2048 EK's certificate (TCG EK Credential Profile), where `swtpm_setup
--create-ek-cert` and TPM vendors put it."""
CREDENTIAL_FILE_MAGIC = 0xBADCC0DE
"""tpm2-tools' header of a `tpm2_makecredential` file: this magic, version 1, then the two TPM2Bs."""


def ek_cert_der(data: bytes) -> bytes:
    """The certificate in an NV index's bytes: its DER, without the padding a fixed-size index keeps after it."""
    if len(data) >= 4 and data[0] == 0x30 and data[1] == 0x82:
        return data[: 4 + int.from_bytes(data[2:4], "big")]
    return data


class Tpm:
    """One TPM, reached through a TCTI (`device:/dev/tpmrm0`, or `swtpm:host=…,port=…` in tests), with tpm2-tools
    run by this process: the TPM device must be this process's to open (root, or the helper)."""

    def __init__(self, tcti: str = DEFAULT_TCTI) -> None:
        self.tcti = tcti
        self._lock = asyncio.Lock()

    @property
    def where(self) -> str:
        return self.tcti

    # -- the operations ----------------------------------------------------------------------------

    async def attestation_key(self) -> ec.EllipticCurvePublicKey:
        return (await self.attestation_public()).key

    async def attestation_public(self) -> TpmPublic:
        async with self._session() as run:
            await run("tpm2_createprimary", "-C", "e", "-G", "ecc256:ecdsa-sha256:null", "-a", AK_ATTRS, "-c", "ak.ctx")
            return parse_public(await run("tpm2_readpublic", "-c", "ak.ctx", "-o", "ak.tpm", out="ak.tpm"))

    async def create_key(self, handle: int) -> TpmPublic:
        """A new node key at `handle` (whatever was there is evicted first)."""
        await self.evict(handle)
        async with self._session() as run:
            await run("tpm2_createprimary", "-C", "o", "-G", "ecc256", "-c", "srk.ctx")
            await run(
                "tpm2_create", "-C", "srk.ctx", "-G", "ecc256:ecdsa-sha256", "-a", NODE_KEY_ATTRS,
                "-u", "key.pub", "-r", "key.priv",
            )  # fmt: skip
            await run("tpm2_load", "-C", "srk.ctx", "-u", "key.pub", "-r", "key.priv", "-c", "key.ctx")
            await run("tpm2_evictcontrol", "-C", "o", "-c", "key.ctx", f"0x{handle:08x}")
        public = await self.read_public(handle)
        if public is None:
            raise BcError(f"the TPM did not keep the new node key at 0x{handle:08x}")
        return public

    async def read_public(self, handle: int) -> TpmPublic | None:
        """The key at `handle`, or None when the handle holds nothing (a cleared TPM)."""
        async with self._session() as run:
            try:
                data = await run("tpm2_readpublic", "-c", f"0x{handle:08x}", "-o", "pub.tpm", out="pub.tpm")
            except _NoHandle:
                return None
        return parse_public(data)

    async def sign(self, handle: int, message: bytes) -> bytes:
        """ECDSA-SHA256 by the key at `handle`, DER-encoded (as `cryptography` makes and checks them)."""
        return await self.sign_digest(handle, hashlib.sha256(message).digest())

    async def sign_digest(self, handle: int, digest: bytes) -> bytes:
        """ECDSA over a SHA-256 `digest` made elsewhere (what the helper's `tpm.key.sign` is sent)."""
        if len(digest) != 32:
            raise BcError(f"a SHA-256 digest is 32 bytes, not {len(digest)}")
        async with self._session() as run:
            await run.write("digest", digest)
            return await run(
                "tpm2_sign", "-c", f"0x{handle:08x}", "-g", "sha256", "-d", "-s", "ecdsa", "-f", "plain",
                "-o", "sig", "digest", out="sig",
            )  # fmt: skip

    async def certify(self, handle: int) -> Certified:
        """The AK's certification of the key at `handle` (`TPM2_Certify`)."""
        async with self._session() as run:
            await run("tpm2_createprimary", "-C", "e", "-G", "ecc256:ecdsa-sha256:null", "-a", AK_ATTRS, "-c", "ak.ctx")
            tpm2b = await run("tpm2_readpublic", "-c", f"0x{handle:08x}", "-o", "pub.tpm", out="pub.tpm")
            await run(
                "tpm2_certify", "-c", f"0x{handle:08x}", "-C", "ak.ctx", "-g", "sha256", "-o", "attest",
                "-s", "sig", "-f", "plain",
            )  # fmt: skip
            attest, sig = await run.read("attest"), await run.read("sig")
        return Certified(handle, parse_public(tpm2b), tpm2b, attest, sig)

    async def evict(self, handle: int) -> bool:
        """Remove the key at `handle` from the TPM; False when it held none."""
        async with self._session() as run:
            try:
                await run("tpm2_evictcontrol", "-C", "o", "-c", f"0x{handle:08x}")
            except _NoHandle:
                return False
        return True

    async def ek_certificate(self) -> bytes | None:
        async with self._session() as run:
            try:
                data = await run("tpm2_nvread", f"0x{EK_CERT_RSA_INDEX:08x}", "-C", "o", "-o", "ek.der", out="ek.der")
            except _NoHandle:
                return None
        return ek_cert_der(data)

    async def activate_credential(self, credential: bytes, secret: bytes) -> bytes:
        """The EK (the standard RSA template, as its certificate names it) and the AK made again from the
        endorsement seed; the EK's policy (PolicySecret of the endorsement hierarchy) in a policy session."""
        blob = struct.pack(">II", CREDENTIAL_FILE_MAGIC, 1) + credential + secret
        async with self._session() as run:
            await run.write("cred.blob", blob)
            await run("tpm2_createek", "-c", "ek.ctx", "-G", "rsa", "-u", "ek.pub")
            await run("tpm2_createprimary", "-C", "e", "-G", "ecc256:ecdsa-sha256:null", "-a", AK_ATTRS, "-c", "ak.ctx")
            await run("tpm2_startauthsession", "--policy-session", "-S", "session.ctx")
            await run("tpm2_policysecret", "-S", "session.ctx", "-c", "e")
            return await run(
                "tpm2_activatecredential", "-c", "ak.ctx", "-C", "ek.ctx", "-i", "cred.blob", "-o", "secret",
                "-P", "session:session.ctx", out="secret",
            )  # fmt: skip

    # -- running the tools ---------------------------------------------------------------------------

    def _session(self) -> _Session:
        return _Session(self)


class _NoHandle(BcError):
    """The persistent handle named holds no key."""


class _Runner:
    """Runs tpm2-tools commands in a private scratch directory; `out=` returns that file's bytes."""

    def __init__(self, tpm: Tpm, workdir: Path) -> None:
        self.tpm, self.workdir = tpm, workdir

    async def write(self, name: str, data: bytes) -> None:
        await asyncio.to_thread((self.workdir / name).write_bytes, data)

    async def read(self, name: str) -> bytes:
        return await asyncio.to_thread((self.workdir / name).read_bytes)

    async def __call__(self, *argv: str, out: str | None = None) -> bytes:
        try:
            return await self._run(argv, out)
        finally:
            # Without a resource manager (swtpm) every object a command loads stays loaded, and a TPM has room
            # for three: flush after each command, failed ones too (.ctx files are saved contexts, loaded again
            # on use). A flush that fails (no TPM) leaves the command's own outcome to speak.
            with contextlib.suppress(BcError):
                await self._run(("tpm2_flushcontext", "-t"), None)

    async def _run(self, argv: tuple[str, ...], out: str | None) -> bytes:
        env = {**os.environ, "TPM2TOOLS_TCTI": self.tpm.tcti}
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=self.workdir,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
            )
        except FileNotFoundError:
            raise TpmUnavailable(f"{UNAVAILABLE} ({argv[0]} is not installed: install tpm2-tools)") from None
        try:
            async with asyncio.timeout(TOOL_TIMEOUT_S):
                _, err = await proc.communicate()
        except TimeoutError:
            raise TpmUnavailable(f"{UNAVAILABLE} ({argv[0]} did not finish in {TOOL_TIMEOUT_S:.0f} s)") from None
        finally:
            if proc.returncode is None:  # timed out or cancelled: the command must not outlive its caller
                proc.kill()
                await proc.wait()
        if proc.returncode != 0:
            text = err.decode(errors="replace")
            low = text.lower()
            said = [ln.strip() for ln in text.splitlines() if ln.startswith("ERROR:") and "Unable to run" not in ln]
            last = said[0] if said else (text.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
            if any(h in text for h in _NO_HANDLE_HINTS):
                raise _NoHandle(f"{argv[0]}: {last}")
            if any(h in low for h in _UNREACHABLE_HINTS):
                raise TpmUnavailable(f"{UNAVAILABLE} ({self.tpm.tcti}: {last})")
            raise BcError(f"the TPM refused {argv[0]}: {last}")
        return await self.read(out) if out is not None else b""


class _Session:
    """One sequence of commands: the TPM's lock, a scratch directory, and the transient objects flushed after."""

    def __init__(self, tpm: Tpm) -> None:
        self.tpm = tpm
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    async def __aenter__(self) -> _Runner:
        await self.tpm._lock.acquire()
        try:
            self._tmp = await asyncio.to_thread(tempfile.TemporaryDirectory, prefix="bc-tpm-")
        except BaseException:
            self.tpm._lock.release()
            raise
        return _Runner(self.tpm, Path(self._tmp.name))

    async def __aexit__(self, *exc: object) -> None:
        try:
            assert self._tmp is not None
            run = _Runner(self.tpm, Path(self._tmp.name))
            try:
                await run._run(("tpm2_flushcontext", "-s"), None)  # sessions; objects went after each command
            except BcError:
                pass  # nothing to flush, or the TPM went away: the command's own error is what counts
            await asyncio.to_thread(self._tmp.cleanup)
        finally:
            self.tpm._lock.release()


# -- the node key as the agent uses it -----------------------------------------------------------


class TpmNodeKey:
    """The node key of a TPM identity: `node.key`'s record, the TPM that holds the key, the checks."""

    def __init__(self, tpm: TpmDevice, record: TpmRecord) -> None:
        self.tpm, self.record = tpm, record

    @staticmethod
    async def create(tpm: TpmDevice, handle: int = HANDLES[0]) -> TpmNodeKey:
        """A new node key in the TPM (at join), with the TPM's AK recorded beside it."""
        public = await tpm.create_key(handle)
        ak = await tpm.attestation_key()
        return TpmNodeKey(tpm, TpmRecord(handle, spki(public.key).hex(), ak_uri(ak)))

    async def public_key(self) -> ec.EllipticCurvePublicKey:
        public = await self.tpm.read_public(self.record.handle)
        if public is None or spki(public.key).hex() != self.record.public_spki_hex:
            raise Unauthenticated(CLEARED)
        return public.key

    async def sign(self, message: bytes) -> bytes:
        await self.public_key()  # a cleared TPM says so, rather than "handle is not correct"
        return await self.tpm.sign(self.record.handle, message)

    async def check(self, cert: x509.Certificate) -> None:
        """Raise the sentence of the failure mode this identity is in, if any (see the module docstring).

        The AK first: another TPM also lacks the key, and its sentence is the one that says why.
        """
        named = [u for u in _san_uris(cert) if u.startswith(AK_URI_PREFIX)]
        ak = ak_uri(await self.tpm.attestation_key())
        if named and named[0] != ak:
            raise Unauthenticated(ANOTHER_AK)
        key = await self.public_key()
        if spki(key) != spki(_ec_public(cert.public_key())):
            raise Unauthenticated(CLEARED)

    async def create_next(self) -> Certified:
        """A next key at the other handle, certified by the AK (a renewal sends it)."""
        other = HANDLES[1] if self.record.handle == HANDLES[0] else HANDLES[0]
        await self.tpm.create_key(other)
        return await self.tpm.certify(other)

    async def next_key(self, node_id: str) -> NextKey:
        """A renewal's next key (`agent.key_holder`): made in the TPM, its CSR signed there, certified by the AK."""
        nxt = await self.create_next()
        csr_der = await make_remote_csr(nxt.public.key, node_id, lambda m: self.tpm.sign(nxt.handle, m))
        ak = await self.tpm.attestation_key()
        record = TpmRecord(nxt.handle, spki(nxt.public.key).hex(), self.record.ak_uri)
        certification = TpmCertification(spki(ak), nxt.tpm2b_public, nxt.attest, nxt.signature)
        return NextKey(nxt.public.key, csr_der, record.dump(), certification)

    async def adopt(self, nxt: NextKey) -> None:
        old = self.record.handle
        self.record = TpmRecord.load(nxt.stored)
        if old != self.record.handle:
            await self.tpm.evict(old)

    async def promote(self, nxt: Certified) -> TpmRecord:
        """The next key becomes the node key (its record returned to store); the old one leaves the TPM."""
        old = self.record.handle
        self.record = TpmRecord(nxt.handle, spki(nxt.public.key).hex(), self.record.ak_uri)
        await self.tpm.evict(old)
        return self.record


def _san_uris(cert: x509.Certificate) -> list[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return list(san.get_values_for_type(x509.UniformResourceIdentifier))


def _ec_public(key: object) -> ec.EllipticCurvePublicKey:
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise Unauthenticated("the key is not an ECDSA key")
    return key


async def open_node_key(path: Path, tcti: str | None = None, tpm: TpmDevice | None = None) -> NodeKeyHolder:
    """The holder `path` (node.key) calls for: a TPM record opens the TPM (`tpm`, else tpm2-tools at `tcti`, else
    at the kernel's), else a file."""
    data = await asyncio.to_thread(path.read_bytes)
    if TpmRecord.is_record(data):
        return TpmNodeKey(tpm or Tpm(tcti or DEFAULT_TCTI), TpmRecord.load(data))
    return FileNodeKey(path)
