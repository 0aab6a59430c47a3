"""What the `access` section becomes on disk: pure functions, no I/O.

Under the SSH directory (`<data-dir>/ssh`, or `--ssh-dir`, e.g. `/etc/ssh/bc`):

* `ca.pub`: the section's SSH CA public keys, one per line (`TrustedUserCAKeys`);
* `principals/<user>`: for each local user, the principals that may log in as
  it (`AuthorizedPrincipalsFile .../principals/%u`). Only this node's own
  principals are written: `oncall@n3` on n3 maps to the user `oncall`; a
  principal naming another node, or none, is left out;
* `revoked.krl`: a KRL revoking the section's serials under every CA key
  (`RevokedKeys`), built by `ssh-keygen -k`; its input is kept beside it as
  `revoked.krl.src`, so a pass knows whether the KRL is current without
  rebuilding it (a KRL records when it was made, so two builds never match);
* `sshd.conf`: the drop-in that points sshd at the three, which the host's
  `sshd_config` includes (docs/ssh.md).

Anything that could add a line to these files makes the section invalid
(`InvalidAccess`) and nothing is written: a control character, a CA key line
that is not exactly one OpenSSH public key, a principal with whitespace or a
comma (`bc.protocol.ssh_lines`). An empty section (no CA keys, principals or
serials) writes nothing, and every file above is removed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bc.protocol import ssh_lines
from bc.protocol.pb import spec_pb2

CA_FILE = "ca.pub"
PRINCIPALS_DIR = "principals"
KRL_FILE = "revoked.krl"
KRL_SOURCE_FILE = "revoked.krl.src"
DROPIN_FILE = "sshd.conf"
HEADER = "# written by bc node from this node's access section; every pass rewrites it\n"


class InvalidAccess(ValueError):
    """A section whose text could add a line to sshd's files: refused whole, nothing applied."""


@dataclass(frozen=True)
class AccessFiles:
    """The files a section makes: text files by path under the SSH directory, and the KRL's inputs."""

    files: dict[str, bytes] = field(default_factory=dict)
    ca_keys: tuple[str, ...] = ()
    serials: tuple[int, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.files

    def krl_source(self) -> bytes:
        """`revoked.krl.src`: what the KRL was built from (CA keys, then serials)."""
        lines = [f"ca: {k}" for k in self.ca_keys] + [f"serial: {s}" for s in self.serials]
        return (HEADER + "".join(line + "\n" for line in lines)).encode()

    def krl_spec(self) -> bytes:
        """The `ssh-keygen -k` input: one `serial:` line per revoked serial."""
        return "".join(f"serial: {s}\n" for s in self.serials).encode()


def check_ssh_dir(ssh_dir: Path) -> None:
    """The directory is written into sshd's config unquoted: refuse one sshd would split or misread."""
    text = str(ssh_dir)
    if not ssh_dir.is_absolute():
        raise InvalidAccess(f"the SSH directory {text!r} is not an absolute path")
    if any(c.isspace() or c in "\"'#%\\" for c in text) or any(not c.isprintable() for c in text):
        raise InvalidAccess(
            f"the SSH directory {text!r} holds whitespace, a quote, # or %, which sshd_config cannot take"
        )


def dropin(ssh_dir: Path) -> str:
    return (
        HEADER
        + f"TrustedUserCAKeys {ssh_dir / CA_FILE}\n"
        + f"AuthorizedPrincipalsFile {ssh_dir / PRINCIPALS_DIR}/%u\n"
        + f"RevokedKeys {ssh_dir / KRL_FILE}\n"
    )


def desired(section: spec_pb2.AccessSection, node_id: str, ssh_dir: Path) -> AccessFiles:
    """The files this section makes on node `node_id`; InvalidAccess (one sentence) when it may not apply."""
    check_ssh_dir(ssh_dir)
    for i, key in enumerate(section.ssh_ca_keys):
        why = ssh_lines.key_line_problem(key)
        if why is not None:
            raise InvalidAccess(f"ssh_ca_keys[{i}] {why}")
    by_user: dict[str, list[str]] = {}
    for i, p in enumerate(section.principals):
        why = ssh_lines.section_principal_problem(p)
        if why is not None:
            raise InvalidAccess(f"principals[{i}] {p!r} {why}")
        user = ssh_lines.own_user(p, node_id)
        if user is not None and p not in by_user.setdefault(user, []):
            by_user[user].append(p)
    serials: list[int] = []
    for i, text in enumerate(section.revoked_serials):
        n = ssh_lines.parse_serial(text)
        if n is None:
            raise InvalidAccess(f"revoked_serials[{i}] {text!r} is not a certificate serial (decimal, 1 to 2^64-1)")
        serials.append(n)
    ca_keys = tuple(" ".join(k.split()[:2]) for k in section.ssh_ca_keys)
    by_user = {u: ps for u, ps in by_user.items() if ps}
    if not ca_keys and not by_user and not serials:
        return AccessFiles()
    files: dict[str, bytes] = {
        CA_FILE: (HEADER + "".join(k + "\n" for k in ca_keys)).encode(),
        DROPIN_FILE: dropin(ssh_dir).encode(),
    }
    for user, ps in sorted(by_user.items()):
        files[f"{PRINCIPALS_DIR}/{user}"] = (HEADER + "".join(p + "\n" for p in sorted(ps))).encode()
    return AccessFiles(files, ca_keys, tuple(sorted(set(serials))))


def managed(paths: list[str]) -> list[str]:
    """Which of the relative paths found under the SSH directory are this converger's to replace or remove."""
    fixed = {CA_FILE, KRL_FILE, KRL_SOURCE_FILE, DROPIN_FILE}
    return sorted(p for p in paths if p in fixed or (p.startswith(PRINCIPALS_DIR + "/") and p.count("/") == 1))
