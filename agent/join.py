"""`bc join`: a token becomes this node's identity.

1. Parse the token; for each `--server` address in turn, fetch the server's CA over a raw TLS
   handshake and keep it only if its fingerprint matches the token's pin.
2. Call `Join` there (an api process, or a gateway that forwards it to one; an unreachable address or a
   gateway that reaches no api process passes to the next) over mutual TLS with a CSR for a key generated
   here (it never leaves the host) and the token's proof: a signature by the key the secret derives over
   the token id and the CSR (`bc.pki.tokens.join_proof`). The TLS client certificate is a short-lived
   leaf under the install's join root, whose key comes from the token's CA pin; it proves nothing by
   itself, so a used, expired or mistyped token is refused by Join in a sentence.
3. Check the CA key's signature over the answer (`bc.pki.join_answer`): a gateway's certificate also
   satisfies the pin, so only that signature says the certificate and trust bundle are the api's.
4. Store `identity.json`, `node.key` (0600), `node.crt` and `ca.crt`.

`bc join --reset --yes` first moves the old identity and journal aside
(`reset_identity`): renamed with a `.reset-<UTC time>` suffix, never deleted,
so a node whose key or certificate is lost for good can join again while the
old files stay for whoever investigates. The journal goes too: `bc node`
refuses a journal of another node id, and a re-join may get another id.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from agent.identity import IDENTITY_FILE, NEXT_SUFFIX, Identity
from agent.tpm import DEFAULT_TCTI, Tpm, TpmDevice
from bc.errors import BcError, Unauthenticated, Unavailable, UsageError
from bc.pki import join_answer, keys, tokens
from bc.pki.discovery import fetch_pinned_ca
from bc.pki.identity import make_csr
from bc.protocol.pb import join_pb2
from bc.runtime.files import atomic_write, fsync_dir
from bc.seams.clock import SystemClock
from bc.wire.status import status_to_error
from bc.wire.stubs import join_pb2_grpc
from bc.wire.tls import channel_credentials

JOURNAL_FILE = "journal.db"
_IDENTITY_FILES = ("node.key", "node.crt", "ca.crt")
_JOURNAL_SUFFIXES = ("", "-wal", "-shm")


@dataclass(frozen=True)
class JoinResult:
    node_id: str
    ca_fingerprint: str
    cert_not_after: float
    data_dir: Path
    moved_aside: tuple[Path, ...] = ()


def split_server(server: str) -> tuple[str, int]:
    host, sep, port = server.rpartition(":")
    if not sep or not port.isdigit():
        raise UsageError(f"--server must be HOST:PORT, not {server!r}")
    return host.strip("[]"), int(port)


def servers_of(server: str) -> list[str]:
    """`--server A:P[,B:P…]`: the gateways a node may dial, in the order given, each checked as HOST:PORT."""
    addrs = [a.strip() for a in server.split(",") if a.strip()]
    if not addrs:
        raise UsageError("--server must be HOST:PORT (or several, comma-separated)")
    for a in addrs:
        split_server(a)
    return addrs


async def join_node(
    server: str,
    token: str,
    data_dir: Path,
    *,
    reset: bool = False,
    attestor: str = "file",
    tcti: str | None = None,
    tpm: TpmDevice | None = None,
) -> JoinResult:
    """Join through the first of `server`'s addresses that answers (all of them kept, for the session to
    dial): an api process, or a gateway that forwards the join to one. An address that cannot be reached,
    or whose gateway reaches no api process, passes to the next. With `reset`, the old identity and journal
    are moved aside once a server's CA checks out. With `attestor="tpm"` the node key is made inside the TPM
    (`tpm`: the helper's, for an unprivileged node; else tpm2-tools at `tcti`, else at the kernel's resource
    manager) and certified by its attestation key (`agent.tpm`); node.key then holds a record of it, never the key."""
    parsed = tokens.parse_token(token)
    addrs = servers_of(server)
    if not reset and Identity.exists(data_dir):
        ident = Identity.load(data_dir)
        raise UsageError(f"{data_dir} already holds the identity of node {ident.node_id}; use another --data-dir")
    if attestor not in ("file", "tpm"):
        raise UsageError(f"--attestor must be file or tpm, not {attestor!r}")
    join_key_pem, join_cert_pem = tokens.join_client_credentials(parsed, SystemClock())
    key_file: bytes
    tpm_cert: join_pb2.TpmCertification | None = None
    device: TpmDevice | None = None
    endorsement: tuple[bytes, bytes] = (b"", b"")
    if attestor == "tpm":
        device = tpm or Tpm(tcti or DEFAULT_TCTI)
        csr_der, key_file, tpm_cert = await _tpm_key(data_dir, device)
        endorsement = await _endorsement(device)
    else:
        node_key = keys.generate_key()
        csr_der = make_csr(node_key, "pending").public_bytes(Encoding.DER)
        key_file = keys.key_to_pem(node_key)
    req = join_pb2.JoinRequest(
        csr_der=csr_der,
        hostname=socket.gethostname(),
        token_id=parsed.token_id,
        token_proof=tokens.join_proof(parsed.secret, parsed.token_id, csr_der),
    )
    if tpm_cert is not None:
        req.tpm.CopyFrom(tpm_cert)
        req.ek_cert_der, req.ak_public = endorsement
    moved: list[Path] | None = None
    passed: list[str] = []  # why each address before the one that answered did not
    for addr in addrs:
        host, port = split_server(addr)
        try:
            ca_pem = await asyncio.to_thread(fetch_pinned_ca, host, port, parsed.ca_pin)
        except Unavailable as e:
            passed.append(e.message)
            continue
        if reset and moved is None:
            # After the pin check, so a mistyped --server or a token for another cluster leaves the old identity.
            moved = await asyncio.to_thread(reset_identity, data_dir, SystemClock().now())
        creds = channel_credentials(ca_pem, join_key_pem, join_cert_pem)
        resp = await _join_at(addr, creds, req, passed)
        if resp is not None and resp.HasField("challenge") and device is not None:
            resp = await _join_at(addr, creds, await _activated(device, req, resp.challenge), passed)
        if resp is None:
            continue
        _check_answer(addr, keys.load_cert_pem(ca_pem), csr_der, resp)
        cert = x509.load_pem_x509_certificate(resp.cert_pem)
        ident = Identity(
            node_id=resp.node_id,
            role=resp.role,
            server=",".join(addrs),
            identity_generation=resp.identity_generation,
            ca_fingerprint=parsed.ca_pin,
            trust_bundle_b64=base64.b64encode(resp.trust.SerializeToString()).decode(),
            join_ssh_ca_keys=list(resp.ssh_ca_keys),
        )
        await asyncio.to_thread(_store_identity, data_dir, ident, key_file, resp.cert_pem, ca_pem)
        return JoinResult(
            resp.node_id, parsed.ca_pin, cert.not_valid_after_utc.timestamp(), data_dir, tuple(moved or ())
        )
    if len(addrs) == 1:
        raise Unavailable(passed[0])
    raise Unavailable(f"no address of --server took the join: {'; '.join(passed)}")


async def _join_at(
    addr: str, creds: grpc.ChannelCredentials, req: join_pb2.JoinRequest, passed: list[str]
) -> join_pb2.JoinResponse | None:
    """Join's answer at `addr`, or None (the reason appended to `passed`) when the next address should try:
    unreachable, a gateway that reaches no api process (UNAVAILABLE), or one older than the join proxy
    (UNIMPLEMENTED). Any other refusal is the answer, raised as the sentence the server gave."""
    try:
        async with grpc.aio.secure_channel(addr, creds) as ch:
            resp: join_pb2.JoinResponse = await join_pb2_grpc.JoinStub(ch).Join(req, timeout=20)
        return resp
    except grpc.aio.AioRpcError as e:
        details = e.details() or ""
        err: BcError = status_to_error(e.code(), details)
        if isinstance(err, Unavailable) and refused_in_handshake(details):
            # The server answered a moment ago (its CA matched the pin), so a handshake it closes now is a
            # refusal of the join certificate under the join root that pin derives: a bc serve from before
            # one join root per install, which trusted a root per token instead. The token itself is judged
            # by Join, in a sentence.
            raise Unauthenticated(
                f"bc serve at {addr} refused this bc join's client certificate in the TLS handshake: it likely"
                " runs an older bc that expects another join protocol; join with a bc of the same version as"
                " bc serve, or upgrade bc serve"
            ) from None
        if e.code() == grpc.StatusCode.UNIMPLEMENTED or isinstance(err, Unavailable):
            passed.append(f"cannot join through {addr}: {details.splitlines()[0] if details else e.code().name}")
            return None
        raise err from None


def _check_answer(addr: str, ca_cert: x509.Certificate, csr_der: bytes, resp: join_pb2.JoinResponse) -> None:
    """Keep the answer only if the pinned CA's key signed it: a gateway in the middle holds a certificate
    that satisfies the pin, but not that key (`bc.pki.join_answer`)."""
    if not resp.answer_signature:
        raise Unauthenticated(
            f"bc serve at {addr} answered the join without the CA's signature over it: it runs an older bc;"
            " join with a bc of the same version as bc serve, or upgrade bc serve"
        )
    trust = resp.trust.SerializeToString(deterministic=True)
    if not join_answer.verify_answer(
        ca_cert, csr_der, resp.cert_pem, trust, resp.answer_signature, list(resp.ssh_ca_keys)
    ):
        raise Unauthenticated(
            f"the join answer that came through {addr} is not signed by the CA the token pins: something between"
            " this node and the api process changed it; nothing was stored (the token is used: create a new one"
            " with `bc token create` and join through another address)"
        )


def refused_in_handshake(details: str) -> bool:
    """grpc's words for a TLS handshake the server ended: what a client certificate it refuses gets."""
    low = details.lower()
    return "socket closed" in low or "handshake" in low or "connection reset" in low


def identity_files(data_dir: Path) -> list[Path]:
    """The files a reset moves that exist: the identity (also its files named in identity.json) and the journal.

    Files are listed even without identity.json: a join that crashed half-way leaves a key that a new join
    would otherwise overwrite.
    """
    names = [IDENTITY_FILE, *_IDENTITY_FILES, *_named_files(data_dir)]
    # A renewal's pending pair goes too: left behind, it could be taken for the new identity's.
    names += [n + NEXT_SUFFIX for n in names[1:]]
    names += [JOURNAL_FILE + suffix for suffix in _JOURNAL_SUFFIXES]
    return [data_dir / n for n in dict.fromkeys(names) if (data_dir / n).is_file()]


def _named_files(data_dir: Path) -> list[str]:
    """The file names identity.json lists, read without `Identity.load` (which may complete a renewal on disk)."""
    try:
        files = json.loads(Identity.path(data_dir).read_text()).get("files", {})
        return [str(n) for n in files.values()] if isinstance(files, dict) else []
    except (OSError, ValueError, AttributeError):
        return []  # no or unreadable identity.json: the default names are all we know


def reset_identity(data_dir: Path, now: float) -> list[Path]:
    """Rename the identity and journal files to `<name>.reset-<UTC time>`; returns the new paths.

    identity.json goes first: without it the directory holds no identity, which is what a crash
    half-way through should leave.
    """
    stamp = datetime.fromtimestamp(now, tz=UTC).strftime("%Y%m%dT%H%M%SZ")
    files = identity_files(data_dir)
    suffix = _free_suffix(files, f".reset-{stamp}")
    moved = []
    for path in files:
        aside = path.with_name(path.name + suffix)
        os.rename(path, aside)
        moved.append(aside)
    if moved:
        fsync_dir(data_dir)
    return moved


def _free_suffix(files: list[Path], base: str) -> str:
    """`base`, or `base-2`, `base-3`…: two resets in one second must not rename over the first one's files."""
    n = 1
    while True:
        suffix = base if n == 1 else f"{base}-{n}"
        if not any(p.with_name(p.name + suffix).exists() for p in files):
            return suffix
        n += 1


async def _tpm_key(data_dir: Path, tpm: TpmDevice) -> tuple[bytes, bytes, join_pb2.TpmCertification]:
    """A node key made in the TPM: (the CSR it signed, node.key's record, the AK's certification of it).

    The key goes to the persistent handle the identity in `data_dir` (if any) does not use, so a re-join
    (`--reset`) leaves the old identity's key where its record, moved aside, says it is.
    """
    from agent.tpm import HANDLES, TpmNodeKey, TpmRecord
    from bc.pki.remote_csr import make_remote_csr
    from bc.pki.tpm_attest import spki

    handle = HANDLES[0]
    try:
        old = await asyncio.to_thread((data_dir / "node.key").read_bytes)
        if TpmRecord.is_record(old) and TpmRecord.load(old).handle == HANDLES[0]:
            handle = HANDLES[1]
    except (OSError, BcError):
        pass  # no identity yet, or not a TPM one: the first handle
    node_key = await TpmNodeKey.create(tpm, handle)
    csr_der = await make_remote_csr(await node_key.public_key(), "pending", node_key.sign)
    certified = await tpm.certify(handle)
    ak = await tpm.attestation_key()
    cert = join_pb2.TpmCertification(
        ak_spki_der=spki(ak), key_public=certified.tpm2b_public, attest=certified.attest, signature=certified.signature
    )
    return csr_der, node_key.record.dump(), cert


async def _endorsement(tpm: TpmDevice) -> tuple[bytes, bytes]:
    """(the TPM's RSA EK certificate or b"", the AK's TPM2B_PUBLIC): what a server with EK roots activates the AK
    against; a server without them ignores both."""
    return (await tpm.ek_certificate() or b""), (await tpm.attestation_public()).tpm2b


async def _activated(
    tpm: TpmDevice, req: join_pb2.JoinRequest, challenge: join_pb2.TpmChallenge
) -> join_pb2.JoinRequest:
    """The join again, with the secret the TPM recovered from the server's challenge (`bc.pki.tpm_ek`)."""
    try:
        secret = await tpm.activate_credential(challenge.credential, challenge.secret)
    except (BcError, OSError) as e:
        why = e.message if isinstance(e, BcError) else str(e)
        raise Unauthenticated(
            "the TPM could not activate the server's credential: its endorsement key or attestation key is not the"
            f" one the join sent ({why})"
        ) from None
    again = join_pb2.JoinRequest()
    again.CopyFrom(req)
    again.activation.CopyFrom(join_pb2.TpmActivation(secret=secret, ticket=challenge.ticket))
    return again


def _store_identity(data_dir: Path, ident: Identity, key_file: bytes, cert_pem: bytes, ca_pem: bytes) -> None:
    """Key first (0600), then certificates, then identity.json last: its presence means a complete identity.

    `key_file` is the key's PEM, or (`--attestor tpm`) the record of the key the TPM holds."""
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    atomic_write(data_dir / "node.key", key_file, 0o600)
    atomic_write(data_dir / "node.crt", cert_pem)
    atomic_write(data_dir / "ca.crt", ca_pem)
    ident.save(data_dir)
