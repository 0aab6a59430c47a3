"""Identity rebind, the pure half: the bundle's parser, the disk image handed to the guest, and its answer.

A memory restore resumes its source guest with the source's SSH identity.
When the spec gives the restore its own (`identity_rebind_ref`, a secret of
the broker), the node fetches the bundle `{"v": 1, "account", "principals",
"hostKey"?, "hostCertificate"?}` and hands it to the running guest on a raw
1 MiB disk with the virtio serial `bc-rebind`:

* offset 0: a tar of `nonce`, `account`, `principals` and, with a host key,
  `host_key` and `host_key-cert.pub` (0600 each);
* the last 4 KiB: reserved, zero; the guest's rebind script writes
  `BCREBOUND <nonce>` at its start once sshd took the new identity.

Nothing here touches a file: `image` returns bytes, `acknowledged` reads bytes.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
from dataclasses import dataclass
from typing import Final

IMAGE_BYTES: Final = 1 << 20
ANSWER_BYTES: Final = 4096
SERIAL: Final = "bc-rebind"
ACK: Final = b"BCREBOUND "
MAX_BUNDLE_BYTES = 64 * 1024

ACCOUNT = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
PRINCIPAL = re.compile(r"[\x21-\x7e]{1,256}")
PEM_KEY = re.compile(
    r"-----BEGIN (OPENSSH|EC|RSA) PRIVATE KEY-----\n[A-Za-z0-9+/=\n]+-----END \1 PRIVATE KEY-----\n?", re.ASCII
)
CERT_LINE = re.compile(r"[a-z0-9-]+-cert-v01@openssh\.com [A-Za-z0-9+/=]+( [\x20-\x7e]*)?\n?", re.ASCII)


class RebindError(ValueError):
    """A bundle that is not one: one sentence; it is not retried (the control plane sent it so)."""


@dataclass(frozen=True)
class RebindBundle:
    account: str
    principals: tuple[str, ...]
    host_key: str = ""
    host_certificate: str = ""


def parse_bundle(data: bytes) -> RebindBundle:
    """The bundle checked: version 1, an account name, principal lines, and a PEM host key with an OpenSSH
    certificate line, or neither."""
    if len(data) > MAX_BUNDLE_BYTES:
        raise RebindError(f"the rebind bundle is over {MAX_BUNDLE_BYTES} bytes")
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise RebindError("the rebind bundle is not JSON") from None
    if not isinstance(doc, dict) or doc.get("v") != 1:
        raise RebindError("the rebind bundle is not version 1")
    unknown = set(doc) - {"v", "account", "principals", "hostKey", "hostCertificate"}
    if unknown:
        raise RebindError(f"the rebind bundle has unknown fields: {', '.join(sorted(unknown))}")
    account = doc.get("account")
    if not isinstance(account, str) or not ACCOUNT.fullmatch(account):
        raise RebindError("the rebind bundle's account is not a user name")
    principals = doc.get("principals")
    if not isinstance(principals, list) or not principals or len(principals) > 64:
        raise RebindError("the rebind bundle's principals are not 1 to 64 names")
    for p in principals:
        if not isinstance(p, str) or not PRINCIPAL.fullmatch(p):
            raise RebindError("a principal of the rebind bundle is not one printable word")
    key, cert = doc.get("hostKey", ""), doc.get("hostCertificate", "")
    if not isinstance(key, str) or not isinstance(cert, str):
        raise RebindError("the rebind bundle's hostKey and hostCertificate must be strings")
    if bool(key) != bool(cert):
        raise RebindError("the rebind bundle has a host key without its certificate, or the reverse")
    if key and not PEM_KEY.fullmatch(key):
        raise RebindError("the rebind bundle's hostKey is not a PEM private key")
    if cert and not CERT_LINE.fullmatch(cert):
        raise RebindError("the rebind bundle's hostCertificate is not an OpenSSH certificate line")
    return RebindBundle(account, tuple(principals), key, cert)


def image(bundle: RebindBundle, nonce: str) -> bytes:
    """The raw disk the guest is handed: the tar at offset 0, zeros to 1 MiB, the last 4 KiB left for its answer."""
    files = [
        ("nonce", nonce + "\n"),
        ("account", bundle.account + "\n"),
        ("principals", "\n".join(bundle.principals) + "\n"),
    ]
    if bundle.host_key:
        files += [("host_key", _line(bundle.host_key)), ("host_key-cert.pub", _line(bundle.host_certificate))]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, text in files:
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o600
            tar.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    if len(raw) > IMAGE_BYTES - ANSWER_BYTES:
        raise RebindError("the rebind bundle does not fit its disk")
    return raw + b"\0" * (IMAGE_BYTES - len(raw))


def acknowledged(answer: bytes, nonce: str) -> bool:
    """Whether the last 4 KiB (as read) start with `BCREBOUND <nonce>`: the guest took this identity."""
    want = ACK + nonce.encode()
    return answer.startswith(want) and answer[len(want) : len(want) + 1] in (b"", b"\n", b"\0", b" ")


def answer(nonce: str) -> bytes:
    """What a compliant guest writes at the start of the last 4 KiB (the fake runtime's guest)."""
    return ACK + nonce.encode() + b"\n"


def nonce_of(image_bytes: bytes) -> str:
    """The nonce a guest reads from the tar (the fake runtime plays the guest with this)."""
    with tarfile.open(fileobj=io.BytesIO(image_bytes[: IMAGE_BYTES - ANSWER_BYTES]), mode="r:") as tar:
        f = tar.extractfile("nonce")
        if f is None:
            raise RebindError("the rebind disk has no nonce")
        return f.read().decode().strip()


def _line(text: str) -> str:
    return text if text.endswith("\n") else text + "\n"
