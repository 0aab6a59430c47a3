"""The `access` converger judged by the real OpenSSH tools (`sshd -t`, `ssh-keygen`), no fakes.

A test `sshd_config` (its own host key) includes the converger's drop-in, so
`sshd -t -f` checks exactly what a host would load; the KRL is read back with
`ssh-keygen -Q -l -f` and certificates signed by the section's CA are tested
against it with `ssh-keygen -Q -f`. The reload command appends to a file, so
a test counts reloads.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519

from agent.converge.access import AccessConverger, access_converger
from agent.converge.run import CONVERGED, FAILED
from agent.converge.sshd import find_tool
from bc.pki import ssh as ssh_pki
from bc.protocol.pb import spec_pb2

NODE = "n3"


def keypair() -> tuple[ed25519.Ed25519PrivateKey, str]:
    key = ed25519.Ed25519PrivateKey.generate()
    return key, ssh_pki.public_line(key)


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """A directory with a host key and an sshd_config that includes `<tmp>/ssh/sshd.conf`."""
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd -t insists on its privilege separation directory
    subprocess.run(
        [find_tool("ssh-keygen"), "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "host_key")], check=True
    )
    (tmp_path / "sshd_config").write_text(
        f"HostKey {tmp_path / 'host_key'}\nPasswordAuthentication no\nInclude {tmp_path / 'ssh' / 'sshd.conf'}\n"
    )
    return tmp_path


def converger(host: Path) -> AccessConverger:
    script = f"echo reload >> {host / 'reloads'}"
    reload = f"sh -c {shlex.quote(script)}"
    return access_converger(host / "ssh", NODE, sshd_config=host / "sshd_config", reload_cmd=reload, fake_host=False)


def reloads(host: Path) -> int:
    path = host / "reloads"
    return len(path.read_text().splitlines()) if path.exists() else 0


def section(ca_keys: list[str], principals: list[str] = (), serials: list[int] = ()) -> spec_pb2.AccessSection:  # type: ignore[assignment]
    return spec_pb2.AccessSection(
        ssh_ca_keys=ca_keys, principals=list(principals), revoked_serials=[str(s) for s in serials]
    )


def snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def krl_serials(krl: Path) -> list[int]:
    out = subprocess.run([find_tool("ssh-keygen"), "-Q", "-l", "-f", str(krl)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return [int(line.split(":")[1]) for line in out.stdout.splitlines() if line.startswith("serial:")]


def cert_file(tmp: Path, ca: ed25519.Ed25519PrivateKey, serial: int) -> Path:
    _, user_line = keypair()
    cert = ssh_pki.sign_user_cert(
        ca,
        ssh_pki.parse_public_key(user_line),
        serial=serial,
        key_id="test",
        principals=[f"oncall@{NODE}"],
        valid_after_s=0,
        valid_before_s=2**40,
    )
    path = tmp / f"cert-{serial}.pub"
    path.write_text(cert + "\n")
    return path


def revoked(krl: Path, cert: Path) -> bool:
    out = subprocess.run([find_tool("ssh-keygen"), "-Q", "-f", str(krl), str(cert)], capture_output=True, text=True)
    assert out.returncode in (0, 1), out.stderr
    return "REVOKED" in out.stdout


def sshd_accepts(host: Path) -> bool:
    return subprocess.run([find_tool("sshd"), "-t", "-f", str(host / "sshd_config")]).returncode == 0


async def test_the_files_pass_sshd_and_the_krl_revokes_exactly_the_listed_serials(host: Path) -> None:
    ca, ca_line = keypair()
    ca2, ca2_line = keypair()
    c = converger(host)
    want = section(
        [ca_line + " bc-ssh-user-ca", ca2_line],
        [f"oncall@{NODE}", f"root@{NODE}", "oncall@n4", f"oncall@{NODE}"],
        [7, 5, 1 << 63],
    )
    result = await c.converge(want, 1)
    assert (result.state, result.message) == (CONVERGED, "")
    ssh = host / "ssh"
    assert sshd_accepts(host)
    assert f"TrustedUserCAKeys {ssh / 'ca.pub'}" in (ssh / "sshd.conf").read_text()
    assert [ln for ln in (ssh / "ca.pub").read_text().splitlines() if not ln.startswith("#")] == [ca_line, ca2_line]
    # Only this node's principals, each mapped to its local user; n4's is not written here.
    assert sorted(p.name for p in (ssh / "principals").iterdir()) == ["oncall", "root"]
    assert (ssh / "principals" / "oncall").read_text().splitlines()[1:] == [f"oncall@{NODE}"]
    # The KRL, read by ssh-keygen: the three serials under each CA key, and nothing else.
    assert sorted(krl_serials(ssh / "revoked.krl")) == sorted([5, 7, 1 << 63] * 2)
    assert revoked(ssh / "revoked.krl", cert_file(host, ca, 5))
    assert revoked(ssh / "revoked.krl", cert_file(host, ca2, 7))
    assert not revoked(ssh / "revoked.krl", cert_file(host, ca, 6))
    assert reloads(host) == 1

    # Nothing changed: no tool runs, no reload.
    before = snapshot(ssh)
    assert (await c.converge(want, 1)).state == CONVERGED
    assert snapshot(ssh) == before and reloads(host) == 1

    # A new revocation: the KRL gains it, sshd is reloaded once more.
    assert (await c.converge(section([ca_line], [f"oncall@{NODE}"], [5, 7, 9]), 2)).state == CONVERGED
    assert sorted(krl_serials(ssh / "revoked.krl")) == [5, 7, 9]
    assert revoked(ssh / "revoked.krl", cert_file(host, ca, 9))
    assert not (ssh / "principals" / "root").exists()
    assert reloads(host) == 2

    # An empty section removes every file (the drop-in too) and reloads; sshd still accepts its config.
    assert (await c.converge(spec_pb2.AccessSection(), 3)).state == CONVERGED
    assert snapshot(ssh) == {} and reloads(host) == 3 and sshd_accepts(host)


async def test_a_refused_sshd_t_restores_the_previous_files_and_fails_with_sshds_message(host: Path) -> None:
    _, ca_line = keypair()
    c = converger(host)
    assert (await c.converge(section([ca_line], [f"oncall@{NODE}"], [5]), 1)).state == CONVERGED
    before = snapshot(host / "ssh")
    # sshd now refuses the configuration the drop-in is part of.
    with (host / "sshd_config").open("a") as f:
        f.write("NoSuchOption yes\n")
    result = await c.converge(section([ca_line], [f"root@{NODE}"], [5, 6]), 2)
    assert (result.state, result.reason, result.terminal) == (FAILED, "SshdRefused", True)
    assert "Bad configuration option: NoSuchOption" in result.message
    assert snapshot(host / "ssh") == before  # byte for byte, the KRL included
    assert reloads(host) == 1


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        ({"principals": [f"on call@{NODE}"]}, "holds whitespace"),
        ({"principals": [f"oncall@{NODE}\nroot@{NODE}"]}, "holds whitespace"),
        ({"principals": [f"a,b@{NODE}"]}, "holds a comma"),
        ({"principals": [f"oncall\x1b@{NODE}"]}, "control character U+001B"),
        ({"ca_two": True}, "holds more than one key"),
        ({"ssh_ca_keys": ["ssh-ed25519 AAAA\rssh-rsa AAAA"]}, "control character U+000D"),
        ({"ssh_ca_keys": ["ssh-ed25519"]}, "is not an OpenSSH public key line"),
        ({"revoked_serials": ["0x10"]}, "is not a certificate serial"),
    ],
)
async def test_anything_that_could_add_a_line_applies_nothing(
    host: Path, doc: dict[str, object], fragment: str
) -> None:
    _, ca_line = keypair()
    _, other = keypair()
    c = converger(host)
    assert (await c.converge(section([ca_line], [f"oncall@{NODE}"], [5]), 1)).state == CONVERGED
    before = snapshot(host / "ssh")
    bad = section([ca_line], [f"oncall@{NODE}"], [5])
    if doc.pop("ca_two", False):
        del bad.ssh_ca_keys[:]
        bad.ssh_ca_keys.append(f"{ca_line} {other}")
    for name, values in doc.items():
        field = getattr(bad, name)
        del field[:]
        field.extend(values)  # type: ignore[arg-type]
    result = await c.converge(bad, 2)
    assert (result.state, result.reason, result.terminal) == (FAILED, "InvalidAccess", True)
    assert fragment in result.message and "\n" not in result.message
    assert snapshot(host / "ssh") == before and reloads(host) == 1


async def test_a_failed_reload_is_retried_until_one_succeeds(host: Path) -> None:
    _, ca_line = keypair()
    flag = host / "reload-ok"
    script = f"test -e {flag} && echo reload >> {host / 'reloads'}"
    c = access_converger(
        host / "ssh",
        NODE,
        sshd_config=host / "sshd_config",
        reload_cmd=f"sh -c {shlex.quote(script)}",
        fake_host=False,
    )
    want = section([ca_line], [f"oncall@{NODE}"])
    result = await c.converge(want, 1)
    assert (result.state, result.reason, result.reported_state != FAILED) == (FAILED, "SshdReloadFailed", True)
    flag.touch()
    assert (await c.converge(want, 1)).state == CONVERGED  # files already in place, the reload still owed
    assert reloads(host) == 1
    assert (await c.converge(want, 1)).state == CONVERGED and reloads(host) == 1


def test_the_files_are_world_readable_and_not_writable(host: Path) -> None:
    import asyncio

    _, ca_line = keypair()
    asyncio.run(converger(host).converge(section([ca_line], [f"oncall@{NODE}"], [3]), 1))
    for p in (host / "ssh").rglob("*"):
        if p.is_file():
            assert os.stat(p).st_mode & 0o777 == 0o644, p


async def test_an_agent_that_died_before_reloading_reloads_when_it_is_back(host: Path) -> None:
    _, ca_line = keypair()
    want = section([ca_line], [f"oncall@{NODE}"])
    broken = f"sh -c {shlex.quote('exit 3')}"
    first = access_converger(host / "ssh", NODE, sshd_config=host / "sshd_config", reload_cmd=broken, fake_host=False)
    assert (await first.converge(want, 1)).reason == "SshdReloadFailed"
    # A new process (a restart): the files are in place, the reload it owes is not forgotten.
    second = converger(host)
    assert (await second.converge(want, 1)).state == CONVERGED and reloads(host) == 1
    assert (await second.converge(want, 1)).state == CONVERGED and reloads(host) == 1
