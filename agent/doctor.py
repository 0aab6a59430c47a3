"""`bc doctor` on a node: is this host's identity usable, and is its journal healthy?

The checks are functions of what was read (`NodeFiles`, `JournalSnapshot`)
and of the time, so each one is tested on its own; only the two readers and
`check_server` touch the world. Doctor may run beside a live `bc node`: it
reads the journal through a read-only SQLite connection (never the write
lock, never a checkpoint) and writes nothing anywhere.

The checks, in the order they print: `identity`, `certificate`, `ca`,
`trust-bundle`, `clock`, `journal`, `server`, and on a node set up for
`bc helper` (agent.helper.checks) `privileges` and `helper`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from google.protobuf.message import DecodeError

from agent.helper.checks import DEFAULT_SOCKET, applies, check_not_root, check_release_roots, helper_answer
from agent.helper.client import HelperError
from agent.helper.node_tpm import open_tpm
from agent.identity import Identity
from agent.join import JOURNAL_FILE, split_server
from agent.journal_rules import MAX_BYTES, MAX_EVENTS
from agent.tpm import TpmDevice, TpmNodeKey, TpmRecord
from bc.errors import BcError, Unauthenticated, Unavailable, UsageError
from bc.pki import keys
from bc.pki.discovery import fetch_pinned_ca
from bc.pki.identity import peer_identity
from bc.pki.rejoin import REJOIN_WINDOW_S
from bc.protocol.findings import (
    Finding,
    failed,
    lifetime_left,
    passed,
    read_only_sqlite,
    size_text,
    span,
    utc_text,
    warned,
)
from bc.protocol.pb import common_pb2

RENEW_AT = 0.6
"""The agent renews at 60% of a certificate's lifetime, so less than 40% left means a renewal is overdue."""
CLOCK_OFFSET_LIMIT_MS = 1000
TIME_MARK_LIMIT_MS = 5 * 60 * 1000  # the agent refuses a Welcome more than this before its mark
JOURNAL_WARN_FRACTION = 0.8
SYNC_CLOCK = "sync the host clock (chrony/timedatectl)"


def rejoin_fix(data_dir: Path, ident: Identity | None) -> str:
    server = ident.server if ident else "HOST:PORT"
    node = f" --node-id {ident.node_id}" if ident else ""
    return (
        f"join again with a new token (bc token create{node}): "
        f"bc join --reset --yes --server {server} --token <token> --data-dir {data_dir}"
    )


# -- reading ------------------------------------------------------------------


@dataclass(frozen=True)
class NodeFiles:
    """The identity and its files as read; a file that could not be read is None, with the reason in `problems`."""

    data_dir: Path
    identity: Identity | None
    key: keys.PrivateKey | TpmRecord | None  # a TPM record for `bc join --attestor tpm` (agent.tpm)
    cert: x509.Certificate | None
    ca: x509.Certificate | None
    problems: dict[str, str] = field(default_factory=dict)


def read_identity(data_dir: Path) -> Identity:
    """identity.json as it is: unlike `Identity.load`, this never completes an interrupted key replacement."""
    path = Identity.path(data_dir)
    try:
        return Identity(**json.loads(path.read_text()))
    except FileNotFoundError:
        raise UsageError(f"no node identity in {data_dir}") from None
    except (OSError, ValueError, TypeError) as e:
        raise UsageError(f"the node identity {path} is unreadable: {e}") from None


def load_node_files(data_dir: Path) -> NodeFiles:
    problems: dict[str, str] = {}
    try:
        ident = read_identity(data_dir)
    except UsageError as e:
        return NodeFiles(data_dir, None, None, None, None, {"identity": e.message})
    key: keys.PrivateKey | TpmRecord | None = None
    cert = ca = None
    try:
        data = ident.read(data_dir, "key")
        key = TpmRecord.load(data) if TpmRecord.is_record(data) else keys.load_key_pem(data)
    except (OSError, KeyError, BcError) as e:
        problems["key"] = _why(e)
    try:
        cert = keys.load_cert_pem(ident.read(data_dir, "cert"))
    except (OSError, KeyError, UsageError) as e:
        problems["cert"] = _why(e)
    try:
        ca = keys.load_cert_pem(ident.read(data_dir, "ca"))
    except (OSError, KeyError, UsageError) as e:
        problems["ca"] = _why(e)
    return NodeFiles(data_dir, ident, key, cert, ca, problems)


def _why(e: Exception) -> str:
    if isinstance(e, BcError):
        return e.message
    if isinstance(e, OSError):
        return f"{e.filename or ''}: {e.strerror or e}".strip(": ")
    return f"identity.json names no {e} file"


@dataclass(frozen=True)
class JournalSnapshot:
    path: Path
    exists: bool
    error: str = ""  # why the journal could not be read; empty when it could
    integrity: str = "ok"
    meta: dict[str, str] = field(default_factory=dict)
    unacked_events: int = 0
    file_bytes: int = 0


def read_journal(path: Path) -> JournalSnapshot:
    """The journal's meta, counts and integrity, through a read-only connection."""
    if not path.exists():
        return JournalSnapshot(path, exists=False)
    size = sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())
    try:
        conn = read_only_sqlite(path)
    except sqlite3.Error as e:
        return JournalSnapshot(path, True, error=str(e), file_bytes=size)
    try:
        rows = conn.execute("PRAGMA integrity_check").fetchall()
        problems = [str(r[0]) for r in rows if r[0] != "ok"]
        if problems:
            return JournalSnapshot(path, True, integrity="; ".join(problems[:3]), file_bytes=size)
        meta = {str(k): str(v) for k, v in conn.execute("SELECT key, value FROM meta")}
        count = int(conn.execute("SELECT count(*) FROM events").fetchone()[0])
    except sqlite3.OperationalError as e:  # locked, missing tables, I/O: not (known to be) damage
        return JournalSnapshot(path, True, error=str(e), file_bytes=size)
    except sqlite3.DatabaseError as e:  # "malformed", "not a database": what bc node moves aside as corrupt
        return JournalSnapshot(path, True, integrity=str(e), file_bytes=size)
    finally:
        conn.close()
    return JournalSnapshot(path, True, meta=meta, unacked_events=count, file_bytes=size)


# -- the checks ---------------------------------------------------------------


def check_identity(files: NodeFiles) -> Finding:
    ident, fix = files.identity, rejoin_fix(files.data_dir, files.identity)
    if ident is None:
        return failed("identity", files.problems.get("identity", "no identity"), fix)
    for what in ("key", "cert"):
        if what in files.problems:
            return failed("identity", f"the node {what} is unreadable: {files.problems[what]}", fix)
    assert files.key is not None and files.cert is not None
    if isinstance(files.key, TpmRecord):
        # Only the record is read here: whether the TPM still holds the key is the agent's to find (agent.tpm).
        cert_spki = files.cert.public_key().public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
        if files.key.public_spki_hex != cert_spki.hex():
            return failed("identity", "the TPM key node.key records is not the node certificate's key", fix)
    elif files.cert.public_key() != files.key.public_key():
        return failed("identity", "the node key does not match the node certificate", fix)
    if files.ca is None:
        return failed("identity", "cannot tell who issued the node certificate: ca.crt is unreadable", fix)
    try:
        peer = peer_identity(files.cert, files.ca)
    except Unauthenticated as e:
        return failed("identity", e.message, fix)
    if peer.kind != "node" or peer.name != ident.node_id:
        return failed("identity", f"the certificate names {peer.kind} {peer.name}, identity.json {ident.node_id}", fix)
    if peer.identity_generation != ident.identity_generation:
        return failed(
            "identity",
            f"the certificate is of identity generation {peer.identity_generation},"
            f" identity.json of {ident.identity_generation}: they come from two different joins",
            fix,
        )
    return passed(
        "identity",
        f"node {ident.node_id} (role {ident.role or '-'}, identity generation {peer.identity_generation});"
        " the key matches the certificate"
        + (f" (held by the TPM at handle 0x{files.key.handle:08x})" if isinstance(files.key, TpmRecord) else ""),
    )


def check_certificate(files: NodeFiles, now: float) -> Finding:
    fix = rejoin_fix(files.data_dir, files.identity)
    if files.cert is None:
        return failed("certificate", f"node.crt is unreadable: {files.problems.get('cert', '')}", fix)
    life = lifetime_left(files.cert, now)
    if life.expired:
        # Within 7 days of the expiry `bc node` re-joins with the certificate's key (bc.pki.rejoin) unless it
        # was revoked; the server judges both, this says what the node can tell from its own files.
        until = life.not_after + REJOIN_WINDOW_S
        if now <= until and not (files.identity and files.identity.revoked):
            return failed(
                "certificate",
                f"the certificate expired {span(life.left_s)} ago ({utc_text(life.not_after)}); it cannot be renewed,"
                f" but bc node re-joins with its key until {utc_text(until)} unless it was revoked",
                f"start bc node, which re-joins by itself; if the server refuses it, {fix}",
            )
        return failed(
            "certificate",
            f"the certificate expired {span(life.left_s)} ago ({utc_text(life.not_after)}), more than 7 days ago or"
            " revoked: it can neither be renewed nor re-join with its key",
            fix,
        )
    if now < life.not_before:
        return failed(
            "certificate",
            f"the certificate is valid only from {utc_text(life.not_before)}, {span(life.not_before - now)} from now",
            SYNC_CLOCK,
        )
    where = (
        f"expires in {span(life.left_s)} ({utc_text(life.not_after)}, {life.fraction_left:.0%} of its lifetime left)"
    )
    if life.fraction_left < 1 - RENEW_AT:
        return warned(
            "certificate",
            f"{where}; it is renewed at {RENEW_AT:.0%} of its lifetime and was not",
            "check that the node is connected (see `server`) and its log for renewal errors; once it expires: " + fix,
        )
    return passed("certificate", where)


def check_ca(files: NodeFiles, now: float) -> Finding:
    ident = files.identity
    fix = "restore ca.crt from bc serve's pki/ca.crt, or " + rejoin_fix(files.data_dir, ident)
    if files.ca is None or ident is None:
        return failed("ca", f"ca.crt is unreadable: {files.problems.get('ca', '')}", fix)
    fp = keys.fingerprint(files.ca)
    if fp != ident.ca_fingerprint:
        return failed("ca", f"ca.crt is {fp}, not the CA the join token pinned ({ident.ca_fingerprint})", fix)
    life = lifetime_left(files.ca, now)
    if life.expired:
        return failed(
            "ca",
            f"the cluster CA expired {span(life.left_s)} ago; no certificate it issued is valid",
            "the cluster needs a new CA, and every node a new join",
        )
    return passed("ca", f"ca.crt is the pinned CA {fp[:19]}…, valid until {utc_text(life.not_after)}")


def check_trust_bundle(ident: Identity, now: float) -> Finding:
    fix_roots = "start bc serve once with --command-signing on; the node takes the roots when it next connects"
    try:
        bundle = common_pb2.TrustBundle.FromString(base64.b64decode(ident.trust_bundle_b64, validate=True))
    except (binascii.Error, ValueError, DecodeError):
        return failed(
            "trust-bundle",
            "identity.json's trust bundle is not readable",
            "the node takes a new one when it next connects",
        )
    if not bundle.command_signing_roots:
        return warned(
            "trust-bundle", "no command-signing roots: commands and specs are not signature-checked", fix_roots
        )
    expiries = []
    for i, pem in enumerate(bundle.command_signing_roots, 1):
        try:
            root = x509.load_pem_x509_certificate(pem)
        except ValueError:
            return failed("trust-bundle", f"command-signing root {i} does not parse", fix_roots)
        life = lifetime_left(root, now)
        if life.expired:
            return failed(
                "trust-bundle",
                f"command-signing root {i} ({keys.fingerprint(root)[:19]}…) expired {span(life.left_s)} ago",
                "rotate the command-signing root on bc serve; the node takes the new bundle when it next connects",
            )
        expiries.append(life.not_after)
    n = len(bundle.command_signing_roots)
    if bundle.approver_keys:
        k = max(1, bundle.quorum_k)
        quorum = f"; destructive commands need {k} of {len(bundle.approver_keys)} approvers"
    else:
        quorum = "; no approvers: destructive commands run without a quorum"
    return passed(
        "trust-bundle",
        f"{n} command-signing root{'s' if n > 1 else ''} (the first expires {utc_text(min(expiries))}):"
        f" commands and specs must be signed{quorum}",
    )


def check_clock(ident: Identity, journal: JournalSnapshot, now: float) -> Finding:
    now_ms = round(now * 1000)
    mark = max(ident.server_time_mark_ms, _int(journal.meta.get("server_time_mark_ms")) or 0)
    if mark - now_ms > TIME_MARK_LIMIT_MS:
        return failed(
            "clock",
            f"the server time mark (the latest server time this node has seen) is {span((mark - now_ms) / 1000)}"
            " ahead of this host's clock: this clock is far behind, or the server's once ran far ahead",
            SYNC_CLOCK + ", and check the server's clock",
        )
    offset, at = _int(journal.meta.get("clock_offset_ms")), _int(journal.meta.get("clock_offset_at_ms"))
    if offset is None:
        return warned(
            "clock",
            "the offset to the server's clock is unknown until the node has connected",
            "start bc node; it measures the offset when it connects",
        )
    when = f"measured {span((now_ms - at) / 1000)} ago" if at else "measured at the last connect"
    direction = "behind" if offset > 0 else "ahead of"
    if abs(offset) > CLOCK_OFFSET_LIMIT_MS:
        return warned("clock", f"this host's clock is {abs(offset)} ms {direction} the server's ({when})", SYNC_CLOCK)
    return passed("clock", f"within {abs(offset)} ms of the server's clock ({when})")


def _int(value: str | None) -> int | None:
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def check_journal(ident: Identity, journal: JournalSnapshot) -> Finding:
    lost = (
        "stop bc node and start it again: it moves the journal aside (journal.db.corrupt-<ms>) and starts a new one;"
        " non-retry-safe commands in flight fail journal-lost"
    )
    if not journal.exists:
        return passed("journal", f"no {JOURNAL_FILE} yet: bc node creates it at its first start")
    if journal.error:
        return failed("journal", f"{journal.path} cannot be read: {journal.error}", lost)
    if journal.integrity != "ok":
        return failed("journal", f"{journal.path} is corrupt: {journal.integrity}", lost)
    owner = journal.meta.get("node_id", "")
    if owner and owner != ident.node_id:
        return failed(
            "journal",
            f"{journal.path} belongs to node {owner}, not {ident.node_id}: bc node refuses it",
            f"move {JOURNAL_FILE} (with its -wal and -shm files) aside; bc node starts a new one",
        )
    events, size = journal.unacked_events, journal.file_bytes
    what = (
        f"journal {journal.meta.get('journal_id', '?')}: {events:,} unacked events of {MAX_EVENTS:,},"
        f" {size_text(size)} of {size_text(MAX_BYTES)} on disk, integrity ok"
    )
    if events > JOURNAL_WARN_FRACTION * MAX_EVENTS or size > JOURNAL_WARN_FRACTION * MAX_BYTES:
        return warned(
            "journal",
            what + "; it is filling up",
            "the server is not acknowledging events: check that the node is connected (see `server`); at the bound"
            " metrics are dropped, then new commands are answered BUSY",
        )
    return passed("journal", what)


def check_server(ident: Identity, data_dir: Path, timeout: float = 3.0) -> Finding:
    """A TLS handshake with the server, checking that it presents the pinned CA."""
    try:
        host, port = split_server(ident.server.split(",")[0])
    except UsageError as e:
        return failed("server", f"identity.json names no usable server: {e.message}", rejoin_fix(data_dir, ident))
    started = time.monotonic()
    try:
        fetch_pinned_ca(host, port, ident.ca_fingerprint, timeout=timeout)
    except Unavailable as e:
        return warned(
            "server",
            f"{e.message}; the node keeps enforcing its last spec offline",
            f"check that bc serve runs at {ident.server} and that this host can reach it",
        )
    except Unauthenticated as e:
        return failed(
            "server",
            e.message,
            f"check that {ident.server} is this node's cluster; if the cluster has a new CA, "
            + rejoin_fix(data_dir, ident),
        )
    took_ms = (time.monotonic() - started) * 1000
    return passed("server", f"bc serve at {ident.server} presents the pinned CA ({took_ms:.0f} ms)")


def check_tpm(files: NodeFiles, tpm: TpmDevice) -> Finding | None:
    """A TPM identity's key, asked of the TPM itself: it answers, it still holds the key node.key records at
    its handle, and its attestation key is the one the certificate names (None for a key in a file)."""
    if not isinstance(files.key, TpmRecord) or files.cert is None:
        return None
    fix = rejoin_fix(files.data_dir, files.identity)
    try:
        asyncio.run(TpmNodeKey(tpm, files.key).check(files.cert))
    except Unavailable as e:  # TpmUnavailable: nothing answered at the TCTI, or tpm2-tools is missing
        return failed("tpm", e.message, f"check the TPM at {tpm.where} (bc doctor --tcti names another)")
    except HelperError as e:  # an unprivileged node's TPM is the helper's: it is down, or its TPM is
        return failed("tpm", str(e), "check bc helper and its TPM: systemctl status bc-helper.service")
    except Unauthenticated as e:  # a cleared TPM, or another one: the sentence says which, and its fix
        return failed("tpm", e.message, fix)
    return passed(
        "tpm",
        f"the TPM at {tpm.where} holds the node key at handle 0x{files.key.handle:08x}, and its attestation key is"
        " the one the certificate names",
    )


def run_node_checks(
    data_dir: Path,
    now: float,
    *,
    server_timeout: float = 3.0,
    helper_socket: Path | None = None,
    tcti: str | None = None,
) -> list[Finding]:
    files = load_node_files(data_dir)
    identity = check_identity(files)
    if files.identity is None:
        return [identity]  # nothing else can be judged without knowing whose node this is
    ident = files.identity
    journal = read_journal(data_dir / JOURNAL_FILE)
    # An unprivileged node's TPM is its helper's (unless --tcti names one): the same check, through tpm.* operations.
    socket = (helper_socket or DEFAULT_SOCKET) if tcti is None and applies(data_dir, helper_socket) else None
    tpm = check_tpm(files, open_tpm(socket, tcti)) if identity.status == "pass" else None
    return [
        identity,
        *([tpm] if tpm is not None else []),
        check_certificate(files, now),
        check_ca(files, now),
        check_trust_bundle(ident, now),
        check_clock(ident, journal, now),
        check_journal(ident, journal),
        check_server(ident, data_dir, server_timeout),
        *helper_checks(data_dir, helper_socket),
    ]


def helper_checks(data_dir: Path, helper_socket: Path | None) -> list[Finding]:
    if not applies(data_dir, helper_socket):
        return []
    found, answer = helper_answer(helper_socket or DEFAULT_SOCKET)
    out = [check_not_root(data_dir), found]
    roots = answer.get("release_roots") if answer is not None else None
    if isinstance(roots, str):  # the file the helper itself reads (an older helper names none)
        out.append(check_release_roots(Path(roots)))
    return out
