"""`bc ssh` through the real CLI against a real `bc serve` (gRPC, mutual TLS, SQLite), judged by `ssh-keygen`.

The lab is `test_quorum_cli`'s: the server on its own loop in a thread, n1 and n2 joined, the CLI as
`local` (an admin). Certificates are read back with `ssh-keygen -L`; every refusal is one `error:` line,
a non-zero exit, and nothing stored: no grant, no event, no spec change.
"""

from __future__ import annotations

import json
import re
import subprocess
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from agent.converge.sshd import find_tool
from bc.store import Row
from tests.integration.test_cli_cmd import bc, ok_json
from tests.integration.test_quorum_cli import Lab, approvers, as_operator, refused, running_lab, sign


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    yield from running_lab(tmp_path, monkeypatch)


def user_key(tmp_path: Path, name: str = "id_ed25519") -> Path:
    path = tmp_path / name
    subprocess.run([find_tool("ssh-keygen"), "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(path)], check=True)
    return path.with_suffix(".pub")


def fingerprint(pub: Path) -> str:
    out = subprocess.run([find_tool("ssh-keygen"), "-l", "-f", str(pub)], capture_output=True, text=True, check=True)
    return out.stdout.split()[1]


def keygen_l(cert: str, tmp_path: Path) -> dict[str, Any]:
    """`ssh-keygen -L` on the certificate: its serial, principals, validity and CA fingerprint."""
    path = tmp_path / "id-cert.pub"
    path.write_text(cert + "\n")
    out = subprocess.run([find_tool("ssh-keygen"), "-L", "-f", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    valid = re.search(r"Valid: from (\S+) to (\S+)", text)
    assert valid is not None, text
    principals = re.search(r"Principals:\s*\n((?:\s{16}\S+\n)+)", text)
    return {
        "type": re.search(r"Type: (.*)", text).group(1),  # type: ignore[union-attr]
        "serial": int(re.search(r"Serial: (\d+)", text).group(1)),  # type: ignore[union-attr]
        "ca": re.search(r"Signing CA: \S+ (\S+)", text).group(1),  # type: ignore[union-attr]
        "principals": principals.group(1).split() if principals else [],
        "seconds": (datetime.fromisoformat(valid.group(2)) - datetime.fromisoformat(valid.group(1))).total_seconds(),
    }


def access(node_id: str) -> dict[str, Any]:
    return dict(ok_json("spec", "show", node_id)["spec"].get("access", {}))


def grants(lab: Lab) -> list[Row]:
    async def read() -> list[Row]:
        async with lab.store.transaction(write=False) as tx:
            return await tx.fetchall("SELECT * FROM ssh_grants ORDER BY serial", {})

    return lab.run(read())


def events(prefix: str) -> list[dict[str, Any]]:
    return [e for e in ok_json("events", "--type", prefix)]


def test_ca_init_then_a_grant_that_ssh_keygen_reads_and_a_revocation_on_every_node(lab: Lab, tmp_path: Path) -> None:
    ca = ok_json("ssh", "ca", "init")
    key_file = Path(ca["key_path"])
    assert key_file.stat().st_mode & 0o777 == 0o600 and key_file.parent == tmp_path / "server" / "ssh-ca"
    assert ca["fingerprint"].startswith("SHA256:")
    for n in ("n1", "n2"):
        assert access(n) == {"ssh_ca_keys": [ca["public_key"]]}
    refused(bc("ssh", "ca", "init"), 4, "an SSH CA exists already")

    pub = user_key(tmp_path)
    r = bc("ssh", "grant", "n1", "--principal", "oncall", "--ttl", "45m", "--pubkey", str(pub), "--reason", "disk full")
    assert r.exit_code == 0, r.output
    cert = r.stdout.strip()
    assert "\n" not in cert and "revoke with `bc ssh revoke" in r.stderr
    seen = keygen_l(cert, tmp_path)
    assert seen["type"] == "ssh-ed25519-cert-v01@openssh.com user certificate"
    assert seen["principals"] == ["oncall@n1"] and seen["ca"] == ca["fingerprint"]
    assert seen["seconds"] == 45 * 60 + 60  # the TTL, plus the minute of clock skew before it
    [row] = grants(lab)
    assert (row["state"], int(row["serial"]), row["fingerprint"]) == ("issued", seen["serial"], fingerprint(pub))
    # Who asked and why, in the event log.
    [ev] = events("ssh.granted")
    data = json.loads(ev["data_json"])
    assert ev["subject"] == "n1" and data["login"] == "oncall@n1" and data["reason"] == "disk full"
    assert data["requested_by"] == data["operator"] == "local" and data["serial"] == str(seen["serial"])
    # Only n1 lists the principal.
    assert access("n1")["principals"] == ["oncall@n1"] and "principals" not in access("n2")

    doc = ok_json("ssh", "revoke", str(seen["serial"]), "--reason", "done")
    assert doc["revoked_by"] == "local" and doc["revoke_reason"] == "done"
    for n in ("n1", "n2"):
        assert access(n)["revoked_serials"] == [str(seen["serial"])]
    assert "principals" not in access("n1")  # a revoked grant's principal leaves its node
    refused(bc("ssh", "revoke", str(seen["serial"])), 4, "already revoked")
    listed = ok_json("ssh", "list")
    assert [(g["serial"], g["login"], g["revoked_by"]) for g in listed] == [(seen["serial"], "oncall@n1", "local")]


def two_keys(tmp_path: Path) -> Path:
    a, b = user_key(tmp_path, "a"), user_key(tmp_path, "b")
    both = tmp_path / "both.pub"
    both.write_text(a.read_text() + b.read_text())
    return both


@pytest.mark.parametrize(
    ("make_args", "code", "fragment"),
    [
        (lambda t: ["n1", "--principal", "on call", "--pubkey", str(user_key(t))], 2, "holds whitespace"),
        (lambda t: ["n1", "--principal", "a,b", "--pubkey", str(user_key(t))], 2, "holds a comma"),
        (lambda t: ["n1", "--principal", "oncall", "--ttl", "9h", "--pubkey", str(user_key(t))], 2, "over the maximum"),
        (lambda t: ["n1", "--principal", "oncall", "--pubkey", str(two_keys(t))], 2, "exactly one SSH public key"),
        (lambda t: ["n1", "--principal", "oncall", "--pubkey", str(user_key(t).with_suffix(""))], 2, "public key"),
        (lambda t: ["n1", "--principal", "oncall", "--pubkey", str(t / "missing.pub")], 2, "cannot read"),
        (lambda t: ["n9", "--principal", "oncall", "--pubkey", str(user_key(t))], 3, "no node named 'n9'"),
    ],
)
def test_bad_grants_are_one_sentence_and_change_nothing(
    lab: Lab, tmp_path: Path, make_args: Any, code: int, fragment: str
) -> None:
    ok_json("ssh", "ca", "init")
    before = (access("n1"), access("n2"), len(ok_json("events")))
    refused(bc("ssh", "grant", *make_args(tmp_path)), code, fragment)
    assert grants(lab) == []
    assert (access("n1"), access("n2"), len(ok_json("events"))) == before


def test_a_grant_before_ca_init_and_bad_serials_are_refused(lab: Lab, tmp_path: Path) -> None:
    refused(bc("ssh", "grant", "n1", "--principal", "oncall", "--pubkey", str(user_key(tmp_path))), 4, "ca init")
    refused(bc("ssh", "revoke", "abc"), 2, "is not a certificate serial")
    refused(bc("ssh", "revoke", "12345"), 3, "no SSH certificate with serial 12345")
    assert grants(lab) == [] and access("n1") == {}


def test_root_is_a_batch_signed_only_after_its_quorum(lab: Lab, tmp_path: Path) -> None:
    ok_json("ssh", "ca", "init")
    pub = user_key(tmp_path)
    refused(bc("ssh", "grant", "n1", "--principal", "root", "--pubkey", str(pub)), 4, "no approvers are configured")
    assert grants(lab) == []
    keys = approvers(tmp_path, "alice", "bob", k=2)
    g = ok_json("ssh", "grant", "n1", "--principal", "root", "--pubkey", str(pub), "--reason", "kernel panic")
    assert (g["state"], g["certificate"], g["batch_state"]) == ("pending", "", "pending")
    batch = ok_json("batch", "show", g["batch_id"])
    assert batch["kind"] == "ssh.grant" and [leaf["node_id"] for leaf in batch["leaves"]] == ["n1"]
    assert json.loads(batch["payload_json"])["fingerprint"] == fingerprint(pub)
    assert "principals" not in access("n1")  # nothing on the node until the certificate exists
    refused(bc("ssh", "cert", g["batch_id"]), 4, "has not been approved yet")

    # Each approver's CLI recomputes the leaf (node, principal, key fingerprint) before it signs.
    for name in ("alice", "bob"):
        r = sign(g["batch_id"], keys[name])
        assert r.exit_code == 0, r.output
    r = bc("ssh", "cert", g["batch_id"])
    assert r.exit_code == 0, r.output
    seen = keygen_l(r.stdout.strip(), tmp_path)
    assert seen["principals"] == ["root@n1"] and seen["serial"] == g["serial"]
    assert access("n1")["principals"] == ["root@n1"]
    [ev] = events("ssh.granted")
    assert json.loads(ev["data_json"])["reason"] == "kernel panic"
    # Fetching again returns the same certificate; nothing is signed twice.
    assert bc("ssh", "cert", str(g["serial"])).stdout == r.stdout


def test_a_rejected_root_grant_is_never_signed(lab: Lab, tmp_path: Path) -> None:
    ok_json("ssh", "ca", "init")
    keys = approvers(tmp_path, "alice", "bob", k=2)
    g = ok_json("ssh", "grant", "n2", "--principal", "root", "--pubkey", str(user_key(tmp_path)))

    r = as_operator(
        keys["alice"].config, "approve", "reject", g["batch_id"], "--key", str(keys["alice"].key), "--reason", "no"
    )
    assert r.exit_code == 0, r.output
    refused(bc("ssh", "cert", g["batch_id"]), 4, "was refused")
    [row] = grants(lab)
    assert (row["state"], row["certificate"]) == ("refused", "")
    assert "principals" not in access("n2")


def test_grant_wait_gives_up_at_its_timeout_with_the_batch_still_pending(lab: Lab, tmp_path: Path) -> None:
    ok_json("ssh", "ca", "init")
    approvers(tmp_path, "alice", "bob", k=2)
    pub = str(user_key(tmp_path))
    line = refused(bc("ssh", "grant", "n1", "--principal", "root", "--pubkey", pub, "--wait", "--timeout", "1s"), 4)
    assert "was not decided within 1 s" in line
    [row] = grants(lab)
    assert (row["state"], row["certificate"]) == ("pending", "")


# -- an offline CA: the key never reaches the server; the operator's CLI signs and the server records --------


def test_an_offline_ca_signs_on_the_operators_machine_and_the_server_checks_what_it_records(
    lab: Lab, tmp_path: Path
) -> None:
    key = tmp_path / "offline" / "ca"
    key.parent.mkdir()
    ca = ok_json("ssh", "ca", "init", "--offline-key", str(key))
    assert ca["offline"] and ca["key_path"] == "" and key.stat().st_mode & 0o777 == 0o600
    assert not (tmp_path / "server" / "ssh-ca").exists()  # the server never holds the key
    assert access("n1") == {"ssh_ca_keys": [ca["public_key"]]}
    pub = user_key(tmp_path)

    # Without the key, nothing is asked for; with another key, nothing either.
    refused(bc("ssh", "grant", "n1", "--principal", "oncall", "--pubkey", str(pub)), 2, "pass its key with --ca-key")
    other = tmp_path / "other"
    subprocess.run([find_tool("ssh-keygen"), "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    args = ("ssh", "grant", "n1", "--principal", "oncall", "--pubkey", str(pub))
    refused(bc(*args, "--ca-key", str(other)), 2, "is not the key of this cluster's SSH CA")
    assert grants(lab) == []

    r = bc(*args, "--ttl", "10m", "--ca-key", str(key), "--reason", "fan")
    assert r.exit_code == 0, r.output
    seen = keygen_l(r.stdout.strip(), tmp_path)
    assert seen["principals"] == ["oncall@n1"] and seen["ca"] == ca["fingerprint"] and seen["seconds"] == 11 * 60
    [row] = grants(lab)
    assert (row["state"], int(row["serial"])) == ("issued", seen["serial"])
    assert access("n1")["principals"] == ["oncall@n1"]
    [ev] = events("ssh.granted")
    assert json.loads(ev["data_json"])["reason"] == "fan"


def test_the_server_records_only_the_certificate_it_asked_the_offline_ca_for(lab: Lab, tmp_path: Path) -> None:
    from cryptography.hazmat.primitives.asymmetric import ed25519

    from bc.client.admin import AdminClient
    from bc.pki import ssh as ssh_pki
    from bc.protocol.pb import admin_pb2

    key = tmp_path / "ca"
    ok_json("ssh", "ca", "init", "--offline-key", str(key))
    ca_key = ssh_pki.load_ca_key(key)
    user = ssh_pki.parse_public_key(user_key(tmp_path).read_text())

    async def go() -> list[str]:
        async with AdminClient.discover() as admin:
            g = await admin.ssh_grant(
                admin_pb2.SshGrantRequest(node_id="n1", principal="oncall", public_key=user.line, ttl_s=600)
            )
            assert g.signable and g.state == "pending" and g.certificate == ""

            def cert(signer: ed25519.Ed25519PrivateKey = ca_key, **over: Any) -> str:
                facts: dict[str, Any] = {
                    "serial": g.serial,
                    "key_id": "x",
                    "principals": [g.login],
                    "valid_after_s": g.valid_after_ms // 1000,
                    "valid_before_s": g.valid_before_ms // 1000,
                }
                return ssh_pki.sign_user_cert(signer, over.pop("user", user), **(facts | over))

            other_user = ssh_pki.parse_public_key(ssh_pki.public_line(ed25519.Ed25519PrivateKey.generate()))
            forged = [
                cert(signer=ed25519.Ed25519PrivateKey.generate()),  # another CA
                cert(principals=["root@n1"]),
                cert(principals=[g.login, "oncall@n2"]),
                cert(serial=g.serial + 1),
                cert(valid_before_s=g.valid_before_ms // 1000 + 3600),
                cert(user=other_user),
            ]
            errors = []
            for text in forged:
                try:
                    await admin.ssh_record_cert(g.serial, text)
                except Exception as e:  # each is refused with its sentence
                    errors.append(str(e))
            still = await admin.get_ssh_grant(serial=g.serial)
            assert still.state == "pending" and still.signable
            done = await admin.ssh_record_cert(g.serial, cert())
            assert done.state == "issued" and not done.signable
            return errors

    errors = lab.run(go())
    assert len(errors) == 6
    assert "not signed by this cluster's SSH CA" in errors[0]
    assert all("is not grant" in e for e in errors[1:5]) and "another key" in errors[5]


def test_root_under_an_offline_ca_is_signed_by_the_requester_after_the_quorum(lab: Lab, tmp_path: Path) -> None:
    key = tmp_path / "ca"
    ok_json("ssh", "ca", "init", "--offline-key", str(key))
    keys = approvers(tmp_path, "alice", "bob", k=2)
    pub = str(user_key(tmp_path))
    g = ok_json("ssh", "grant", "n1", "--principal", "root", "--pubkey", pub, "--ca-key", str(key))
    assert (g["state"], g["signable"]) == ("pending", False)  # the quorum first
    refused(bc("ssh", "cert", g["batch_id"], "--ca-key", str(key)), 4, "has not been approved yet")
    for name in ("alice", "bob"):
        assert sign(g["batch_id"], keys[name]).exit_code == 0
    refused(bc("ssh", "cert", g["batch_id"]), 4, "waits for the offline CA's signature")
    r = bc("ssh", "cert", g["batch_id"], "--ca-key", str(key))
    assert r.exit_code == 0, r.output
    seen = keygen_l(r.stdout.strip(), tmp_path)
    assert seen["principals"] == ["root@n1"] and seen["serial"] == g["serial"]
    assert access("n1")["principals"] == ["root@n1"]
