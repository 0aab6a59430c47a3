"""The node's identity on disk: `identity.json`, `node.key` (0600), `node.crt`, `ca.crt`.

`identity.json` also mirrors the server time mark, so a lost journal does not
reopen the clock-rewind window, and keeps the trust bundle last received.

A renewal replaces the key and the certificate together (`replace_key_pair`),
and two files cannot be renamed at once. The crash rule:

1. `node.key.next` (0600) is written and fsynced, then `node.crt.next`;
2. `node.key.next` is renamed over `node.key`, then `node.crt.next` over `node.crt`.

So a `node.crt.next` on disk is always complete and pairs with `node.key.next`
if that still exists, else with `node.key` (renamed already). `Identity.load`
finishes such a half-done replacement (`finish_key_pair`): it renames the
pending files into place when the pending certificate matches its key and
(while node.key has not moved yet) names this node and identity generation
and was issued by `ca.crt`; anything else pending (a lone `node.key.next`
from a crash during step 1, or leftovers of an identity a `bc join --reset`
replaced) is deleted and the old pair, still valid, stays. Either way the
files on disk are a usable pair.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from agent.offload import Offload
from bc.errors import BcError, UsageError
from bc.pki import keys
from bc.pki.identity import peer_identity
from bc.protocol.pb import common_pb2
from bc.runtime.files import atomic_write, fsync_dir

log = logging.getLogger("agent.identity")

NEXT_SUFFIX = ".next"

IDENTITY_FILE = "identity.json"


@dataclass
class Identity:
    node_id: str
    role: str
    server: str
    identity_generation: int
    ca_fingerprint: str
    server_time_mark_ms: int = 0
    trust_bundle_b64: str = ""
    files: dict[str, str] = field(default_factory=lambda: {"key": "node.key", "cert": "node.crt", "ca": "ca.crt"})
    revoked: str = ""  # why the certificate was revoked; the agent does not dial with a revoked identity
    # The SSH CA keys the CA-signed join answer named: the node's baseline for its first spec (agent.spec_quorum).
    join_ssh_ca_keys: list[str] = field(default_factory=list)

    def trust_bundle(self) -> common_pb2.TrustBundle:
        b = common_pb2.TrustBundle()
        if self.trust_bundle_b64:
            b.ParseFromString(base64.b64decode(self.trust_bundle_b64))
        return b

    def set_trust_bundle(self, bundle: common_pb2.TrustBundle) -> None:
        self.trust_bundle_b64 = base64.b64encode(bundle.SerializeToString(deterministic=True)).decode()

    @staticmethod
    def path(data_dir: Path) -> Path:
        return data_dir / IDENTITY_FILE

    @staticmethod
    def exists(data_dir: Path) -> bool:
        return Identity.path(data_dir).is_file()

    @staticmethod
    def load(data_dir: Path) -> Identity:
        p = Identity.path(data_dir)
        if not p.is_file():
            raise UsageError(f"no node identity in {data_dir}; join first with `bc join --server ... --token ...`")
        try:
            doc = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as e:
            raise UsageError(f"the node identity {p} is unreadable ({_reason(e)}); {_REJOIN}") from None
        ident = _from_doc(doc, p)
        finish_key_pair(data_dir, ident)
        return ident

    def save(self, data_dir: Path) -> None:
        atomic_write(Identity.path(data_dir), (json.dumps(asdict(self), indent=2) + "\n").encode(), 0o600)

    def read(self, data_dir: Path, what: str) -> bytes:
        return (data_dir / self.files[what]).read_bytes()


_REJOIN = "move it aside and join again with `bc join --reset --yes`"

# Each field's type; the required ones have no default in `Identity`.
_FIELD_TYPES: dict[str, type] = {
    "node_id": str,
    "role": str,
    "server": str,
    "identity_generation": int,
    "ca_fingerprint": str,
    "server_time_mark_ms": int,
    "trust_bundle_b64": str,
    "files": dict,
    "revoked": str,
    "join_ssh_ca_keys": list,
}
_REQUIRED = ("node_id", "role", "server", "identity_generation", "ca_fingerprint")
_FILE_ROLES = ("key", "cert", "ca")


def _reason(e: BaseException) -> str:
    if isinstance(e, OSError):
        return e.strerror or type(e).__name__
    if isinstance(e, UnicodeDecodeError):
        return "not UTF-8"
    if isinstance(e, RecursionError):
        return "nested too deeply"
    return f"not JSON: {str(e).splitlines()[0]}" if str(e) else "not JSON"


def _from_doc(doc: object, p: Path) -> Identity:
    """An `Identity` from identity.json's document, or one sentence saying what is wrong with it."""
    if not isinstance(doc, dict):
        raise UsageError(f"the node identity {p} is not a JSON object; {_REJOIN}")
    missing = [k for k in _REQUIRED if k not in doc]
    if missing:
        raise UsageError(f"the node identity {p} lacks {', '.join(missing)}; {_REJOIN}")
    unknown = sorted(k for k in doc if k not in _FIELD_TYPES)
    if unknown:
        raise UsageError(f"the node identity {p} has unknown fields {', '.join(map(str, unknown))}; {_REJOIN}")
    for k, want in _FIELD_TYPES.items():
        if k in doc and (not isinstance(doc[k], want) or (want is int and isinstance(doc[k], bool))):
            what = {str: "a string", int: "an integer", dict: "a JSON object", list: "a JSON array"}[want]
            raise UsageError(f"the node identity {p} has a {k} that is not {what}; {_REJOIN}")
    if not all(isinstance(v, str) for v in doc.get("join_ssh_ca_keys", [])):
        raise UsageError(f"the node identity {p} has a join_ssh_ca_keys that is not a list of strings; {_REJOIN}")
    files = doc.get("files")
    if files is not None and not (
        all(r in files for r in _FILE_ROLES)
        and all(isinstance(v, str) and v and "/" not in v and v not in (".", "..") for v in files.values())
    ):
        raise UsageError(f"the node identity {p} names its key, cert and ca files wrongly; {_REJOIN}")
    return Identity(**doc)


def _next(path: Path) -> Path:
    return path.with_name(path.name + NEXT_SUFFIX)


def replace_key_pair(data_dir: Path, ident: Identity, key_pem: bytes, cert_pem: bytes) -> None:
    """Replace node.key and node.crt so that a crash at any point leaves a usable pair (see the module doc)."""
    key_path, cert_path = data_dir / ident.files["key"], data_dir / ident.files["cert"]
    atomic_write(_next(key_path), key_pem, 0o600)
    atomic_write(_next(cert_path), cert_pem, 0o644)  # from here on the new pair wins after a crash
    os.replace(_next(key_path), key_path)
    os.replace(_next(cert_path), cert_path)
    fsync_dir(data_dir)


def finish_key_pair(data_dir: Path, ident: Identity) -> None:
    """Complete or discard a replacement of node.key/node.crt that a crash interrupted (see the module doc)."""
    key_path, cert_path = data_dir / ident.files["key"], data_dir / ident.files["cert"]
    key_next, cert_next = _next(key_path), _next(cert_path)
    if not key_next.exists() and not cert_next.exists():
        return
    key_moved = not key_next.exists()
    pair_key = key_path if key_moved else key_next
    if cert_next.exists() and _pending_pair_ok(data_dir, ident, cert_next, pair_key, key_moved=key_moved):
        if key_next.exists():
            os.replace(key_next, key_path)
        os.replace(cert_next, cert_path)
        log.warning("event=identity.pair-finished cert=%s", cert_path)
    else:
        for stale in (key_next, cert_next):
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()
        log.warning("event=identity.pair-discarded cert=%s", cert_path)
    fsync_dir(data_dir)


def _pending_pair_ok(data_dir: Path, ident: Identity, cert_path: Path, key_path: Path, *, key_moved: bool) -> bool:
    """The pending certificate pairs with `key_path` and is this identity's, from this node's CA.

    Once the key has moved (`key_moved`), the matching key is enough: node.key no longer pairs with
    node.crt, so finishing is the only way to a usable pair, and leftovers of a replaced identity
    cannot match the key a later join generated.
    """
    try:
        cert = keys.load_cert_pem(cert_path.read_bytes())
        if not _pairs(key_path.read_bytes(), cert):
            return False
        if key_moved:
            return True
        peer = peer_identity(cert, keys.load_cert_pem((data_dir / ident.files["ca"]).read_bytes()))
    except (OSError, BcError):
        return False
    return peer.kind == "node" and peer.name == ident.node_id and peer.identity_generation == ident.identity_generation


def _pairs(key_file: bytes, cert: x509.Certificate) -> bool:
    """Whether node.key's content (a PEM key, or a TPM's record of one: agent.tpm) is `cert`'s key."""
    from agent.tpm import TpmRecord

    if TpmRecord.is_record(key_file):
        spki = cert.public_key().public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
        return TpmRecord.load(key_file).public_spki_hex == spki.hex()
    return bool(cert.public_key() == keys.load_key_pem(key_file).public_key())


# -- where the running agent keeps changes to its identity ---------------------------------------


class IdentityStore(Protocol):
    """Keeps identity.json as the running agent changes it (trust bundle, time mark, revoked)."""

    async def save(self, identity: Identity) -> None: ...


class IdentityFile:
    """identity.json in the data dir, written atomically through the agent's offload (a thread in production)."""

    def __init__(self, data_dir: Path, offload: Offload) -> None:
        self.data_dir, self.offload = data_dir, offload

    async def save(self, identity: Identity) -> None:
        await self.offload(identity.save, self.data_dir)


class HeldIdentity:
    """In memory, for the simulator: each save keeps a copy, as a restart would read it back."""

    def __init__(self) -> None:
        self.saved: list[Identity] = []

    async def save(self, identity: Identity) -> None:
        self.saved.append(copy.deepcopy(identity))
