"""What may become a line of sshd's files: one OpenSSH public key, a principal, a certificate serial.

The `access` section's CA keys and principals are written into files sshd
reads line by line (`TrustedUserCAKeys`, `AuthorizedPrincipalsFile`), so
anything that could add a line is refused, never stripped: a control
character, a key line that holds more than one key, whitespace or a comma in
a principal (sshd splits principal lists on commas). The control plane checks
before it stores a spec (`bc.protocol.spec_validation`), the agent again before
it writes a file (`agent.converge.access`), and `bc ssh grant` before it asks.

Pure: each check returns None when the text is fine, else the reason (a
sentence fragment the caller puts after the field's name).
"""

from __future__ import annotations

import base64
import binascii
import re
import struct

from bc.protocol.text_safety import unsafe_char

KEY_TYPES = frozenset(
    {
        "ssh-ed25519",
        "ssh-rsa",
        "ecdsa-sha2-nistp256",
        "ecdsa-sha2-nistp384",
        "ecdsa-sha2-nistp521",
        "sk-ssh-ed25519@openssh.com",
        "sk-ecdsa-sha2-nistp256@openssh.com",
    }
)
"""The plain public key types a CA key or a user key may have (certificates are not keys here)."""

PRINCIPAL = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,31}")
"""A principal as an operator names it (`oncall`, `root`): also the local user it maps to on the node."""
NODE_PRINCIPAL = re.compile(r"([A-Za-z0-9_][A-Za-z0-9._-]{0,31})@([A-Za-z0-9][A-Za-z0-9._-]{0,127})")
"""A principal as a certificate and a node's access section carry it: `<principal>@<node>`."""
SECTION_PRINCIPAL = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._@-]{0,63}")
"""Any principal an access section may list; a node writes only those of the form `<user>@<its own id>`."""
MAX_SERIAL = (1 << 64) - 1


def key_line_problem(line: str) -> str | None:
    """None when `line` is exactly one OpenSSH public key (`type base64 [comment]`), else why not."""
    ch = unsafe_char(line)
    if ch is not None:
        return f"holds the control character U+{ord(ch):04X}"
    parts = line.strip().split(None, 2)
    if len(parts) < 2:
        return "is not an OpenSSH public key line (type and key)"
    key_type, blob_text = parts[0], parts[1]
    if key_type not in KEY_TYPES:
        return f"has the key type {key_type!r}, not one of an OpenSSH public key"
    try:
        blob = base64.b64decode(blob_text, validate=True)
    except (binascii.Error, ValueError):
        return "does not hold a base64 key"
    if len(blob) < 4:
        return "does not hold a key"
    (n,) = struct.unpack(">I", blob[:4])
    if blob[4 : 4 + n] != key_type.encode():
        return f"holds a key whose type is not {key_type}"
    if len(parts) == 3 and any(t in KEY_TYPES for t in parts[2].split()):
        return "holds more than one key"
    return None


def principal_problem(name: str) -> str | None:
    """None when `name` is a principal an operator may grant, else why not."""
    return _name_problem(name, PRINCIPAL, "is not a user name (1-32 of A-Z a-z 0-9 . _ -, not starting with . or -)")


def section_principal_problem(name: str) -> str | None:
    """None when `name` may stand in an access section's principals (a node keeps only its own), else why not."""
    return _name_problem(name, SECTION_PRINCIPAL, "is not a principal (1-64 of A-Z a-z 0-9 . _ @ -)")


def _name_problem(name: str, pattern: re.Pattern[str], not_matching: str) -> str | None:
    """What could add a line or a list entry to sshd's files comes first, then the name's own pattern."""
    if any(c.isspace() for c in name):
        return "holds whitespace"
    if "," in name:
        return "holds a comma"
    ch = unsafe_char(name)
    if ch is not None:
        return f"holds the control character U+{ord(ch):04X}"
    if not pattern.fullmatch(name):
        return not_matching
    return None


def own_user(name: str, node_id: str) -> str | None:
    """The local user a section principal maps to on `node_id` (`oncall@n3` on n3: `oncall`), else None."""
    m = NODE_PRINCIPAL.fullmatch(name)
    return m.group(1) if m is not None and m.group(2) == node_id else None


def parse_serial(text: str) -> int | None:
    """A certificate serial as the access section carries it (decimal, 1 to 2^64-1), or None."""
    if not text.isascii() or not text.isdigit() or len(text) > 20:
        return None
    n = int(text)
    return n if 0 < n <= MAX_SERIAL else None
