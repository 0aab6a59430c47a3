"""bc.pki.ssh: public keys parsed strictly, certificates that `ssh-keygen -L` reads as we meant them."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519

from agent.converge.sshd import find_tool
from bc.errors import Conflict, UsageError
from bc.pki import ssh as ssh_pki
from bc.pki.secrets_source import SystemSecrets, ed25519_key


def keygen(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    subprocess.run([find_tool("ssh-keygen"), "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


def test_a_certificate_reads_back_with_its_serial_principal_validity_and_ca(tmp_path: Path) -> None:
    ca = ed25519.Ed25519PrivateKey.generate()
    user = keygen(tmp_path, "user")
    pub = ssh_pki.parse_public_key(user.with_suffix(".pub").read_text())
    cert = ssh_pki.sign_user_cert(
        ca, pub, serial=(1 << 63) + 5, key_id="bc:alice:oncall@n3", principals=["oncall@n3"],
        valid_after_s=1_800_000_000, valid_before_s=1_800_001_800,
    )  # fmt: skip
    path = tmp_path / "user-cert.pub"
    path.write_text(cert + "\n")
    out = subprocess.run([find_tool("ssh-keygen"), "-L", "-f", str(path)], capture_output=True, text=True, check=True)
    ca_fp = ssh_pki.parse_public_key(ssh_pki.public_line(ca)).fingerprint
    assert f"Signing CA: ED25519 {ca_fp}" in out.stdout
    assert f"Public key: ED25519-CERT {pub.fingerprint}" in out.stdout
    assert f"Serial: {(1 << 63) + 5}" in out.stdout and 'Key ID: "bc:alice:oncall@n3"' in out.stdout
    assert "Principals: \n                oncall@n3\n" in out.stdout
    assert (
        "permit-pty" in out.stdout and "permit-X11-forwarding" not in out.stdout and "permit-user-rc" not in out.stdout
    )
    # ssh-keygen prints local time; the window is what we asked for.
    assert "Valid: from " in out.stdout


def test_the_fingerprint_is_ssh_keygens(tmp_path: Path) -> None:
    user = keygen(tmp_path, "user").with_suffix(".pub")
    out = subprocess.run([find_tool("ssh-keygen"), "-l", "-f", str(user)], capture_output=True, text=True, check=True)
    assert ssh_pki.parse_public_key(user.read_text()).fingerprint == out.stdout.split()[1]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "exactly one SSH public key line, not 0"),
        ("# only a comment\n", "not 0"),
        ("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICgSvCEPeeLHJiWeXDoCuN5bdn6mpHrcxSLMYt/aGFcW\n" * 2, "not 2"),
        ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\n", "not 3"),
        ("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAAA", "usable"),
        ("ssh-ed25519 AAAA\x1b[31m", "control character"),
    ],
)
def test_anything_but_one_public_key_is_refused(text: str, fragment: str) -> None:
    with pytest.raises(UsageError, match=fragment):
        ssh_pki.parse_public_key(text)


def test_the_ca_key_is_0600_never_overwritten_and_refused_when_others_can_read_it(tmp_path: Path) -> None:
    key = ed25519_key(SystemSecrets())
    path = ssh_pki.write_ca_key(tmp_path / "ca", key)
    assert path.stat().st_mode & 0o777 == 0o600
    assert ssh_pki.public_line(ssh_pki.load_ca_key(path)) == ssh_pki.public_line(key)
    with pytest.raises(Conflict, match="never written over a file"):
        ssh_pki.write_ca_key(tmp_path / "ca", ed25519_key(SystemSecrets()))
    path.chmod(0o640)
    with pytest.raises(UsageError, match="readable by others"):
        ssh_pki.load_ca_key(path)
    path.unlink()
    with pytest.raises(UsageError, match="is not there"):
        ssh_pki.load_ca_key(path)


def test_a_grant_leaf_binds_the_principal_and_the_key() -> None:
    a = ssh_pki.grant_digest("root", "SHA256:abc")
    assert a != ssh_pki.grant_digest("oncall", "SHA256:abc") and a != ssh_pki.grant_digest("root", "SHA256:abd")
    with pytest.raises(ValueError):
        ssh_pki.grant_digest("root\nx", "SHA256:abc")
