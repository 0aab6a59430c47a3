"""`bc doctor` on a node's data dir: what an operator reads, and the exit code.

Identities are issued by a real CA, journals are real `bc node` journals, and the server check makes a real
TLS handshake with a listener presenting that CA.
"""

from __future__ import annotations

import hashlib
import json
import random
import sqlite3
from pathlib import Path

from click.testing import CliRunner, Result

from agent.doctor import read_journal, run_node_checks
from agent.identity import Identity
from agent.journal import Journal
from agent.journal_rules import METRIC
from bc.cli.main import cli
from bc.pki import keys
from bc.pki.secrets_source import SystemSecrets
from bc.protocol.findings import Finding
from bc.seams.clock import LoopClock
from tests.unit.doctor.doctor_helpers import Cluster, closed_port, make_journal

RNG = random.Random(1)  # ids and serials, as the one seeded Random of a process would give them
SECRETS = SystemSecrets()

HOUR = 3600


def by_name(findings: list[Finding]) -> dict[str, Finding]:
    return {f.name: f for f in findings}


def digests(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in d.iterdir()}


def doctor(*args: str) -> Result:
    return CliRunner().invoke(cli, ["doctor", *args])


async def healthy(cluster: Cluster) -> Path:
    d = cluster.node_dir("n1")
    await make_journal(d, "n1", {"clock_offset_ms": "120", "clock_offset_at_ms": str(int(cluster.clock.now() * 1000))})
    return d


async def test_a_healthy_node_passes_every_check(cluster: Cluster) -> None:
    d = await healthy(cluster)

    found = run_node_checks(d, cluster.clock.now())

    assert [(f.name, f.status) for f in found] == [
        ("identity", "pass"),
        ("certificate", "pass"),
        ("ca", "pass"),
        ("trust-bundle", "pass"),
        ("clock", "pass"),
        ("journal", "pass"),
        ("server", "pass"),
    ]
    f = by_name(found)
    assert "node n1" in f["identity"].message
    assert "1 command-signing root" in f["trust-bundle"].message
    assert "within 120 ms" in f["clock"].message
    assert "0 unacked events of 10,000" in f["journal"].message
    assert all(x.fix == "" for x in found)


async def test_the_cli_prints_one_line_per_check_and_exits_zero(cluster: Cluster) -> None:
    d = await healthy(cluster)

    r = doctor("--data-dir", str(d))

    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert [line.split()[:2] for line in lines[:7]] == [
        ["pass", name] for name in ("identity", "certificate", "ca", "trust-bundle", "clock", "journal", "server")
    ]
    assert lines[-1] == "7 checks: 7 pass, 0 warn, 0 fail"


async def test_the_cli_json_names_the_role_and_every_check(cluster: Cluster) -> None:
    d = await healthy(cluster)

    r = doctor("--data-dir", str(d), "--json")

    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["role"] == "node" and doc["ok"] is True
    assert doc["checks"][0] == {
        "name": "identity",
        "status": "pass",
        "message": doc["checks"][0]["message"],
        "fix": "",
    }


async def test_a_certificate_expired_over_7_days_ago_fails_with_the_new_token_fix(cluster: Cluster) -> None:
    d = cluster.node_dir("n1", ttl_s=HOUR, age_s=8 * 24 * HOUR)
    await make_journal(d, "n1")
    f = by_name(run_node_checks(d, cluster.clock.now()))["certificate"]
    assert f.status == "fail"
    assert f.message.endswith("more than 7 days ago or revoked: it can neither be renewed nor re-join with its key")
    assert f.fix.startswith("join again with a new token (bc token create --node-id n1): bc join --reset --yes")


async def test_an_expired_certificate_fails_with_the_rejoin_fix_and_exit_9(cluster: Cluster) -> None:
    d = cluster.node_dir("n1", ttl_s=HOUR, age_s=3 * HOUR)
    await make_journal(d, "n1")

    f = by_name(run_node_checks(d, cluster.clock.now()))["certificate"]
    assert f.status == "fail"
    assert f.message.startswith("the certificate expired 2h")
    assert "it cannot be renewed, but bc node re-joins with its key until" in f.message
    assert f.fix.startswith("start bc node, which re-joins by itself; if the server refuses it, join again")
    assert "bc join --reset --yes --server" in f.fix and f"--data-dir {d}" in f.fix
    assert "bc token create --node-id n1" in f.fix

    r = doctor("--data-dir", str(d))
    assert r.exit_code == 9
    assert "fail  certificate" in r.output
    assert "fix: start bc node, which re-joins by itself" in r.output
    assert r.output.splitlines()[-1] == "error: 1 check failed: certificate"


async def test_a_certificate_past_its_renewal_point_warns(cluster: Cluster) -> None:
    d = cluster.node_dir("n1", ttl_s=10 * HOUR, age_s=7 * HOUR)  # 30% left: renewal was due at 60%

    f = by_name(run_node_checks(d, cluster.clock.now()))["certificate"]

    assert f.status == "warn"
    assert "30% of its lifetime left" in f.message
    assert "renewed at 60%" in f.message
    assert "connected" in f.fix


async def test_a_key_that_does_not_match_the_certificate_fails_identity(cluster: Cluster) -> None:
    d = cluster.node_dir("n1")
    keys.write_private_key(d / "node.key", keys.generate_key())  # the TPM was cleared, or a key restored wrong

    f = by_name(run_node_checks(d, cluster.clock.now()))["identity"]

    assert f.status == "fail"
    assert f.message == "the node key does not match the node certificate"
    assert f.fix.startswith("join again with a new token") and "bc join --reset --yes" in f.fix


async def test_a_certificate_of_another_node_fails_identity(cluster: Cluster) -> None:
    d = cluster.node_dir("n1")
    other = cluster.node_dir("n2")
    (d / "node.key").write_bytes((other / "node.key").read_bytes())
    (d / "node.crt").write_bytes((other / "node.crt").read_bytes())

    f = by_name(run_node_checks(d, cluster.clock.now()))["identity"]

    assert f.status == "fail"
    assert f.message == "the certificate names node n2, identity.json n1"


async def test_an_identity_json_of_another_join_fails_identity(cluster: Cluster) -> None:
    d = cluster.node_dir("n1")
    ident = json.loads((d / "identity.json").read_text())
    ident["identity_generation"] = 2
    (d / "identity.json").write_text(json.dumps(ident))

    f = by_name(run_node_checks(d, cluster.clock.now()))["identity"]

    assert f.status == "fail"
    assert f.message.startswith("the certificate is of identity generation 1, identity.json of 2")


async def test_a_ca_that_is_not_the_pinned_one_fails(cluster: Cluster, tmp_path: Path, clock: LoopClock) -> None:
    from bc.pki.ca import CertificateAuthority

    d = cluster.node_dir("n1")
    other, _ = CertificateAuthority.load_or_create(tmp_path / "other-ca", clock, RNG, SECRETS)
    (d / "ca.crt").write_bytes(other.ca_pem)

    f = by_name(run_node_checks(d, cluster.clock.now()))

    assert f["ca"].status == "fail"
    assert f"not the CA the join token pinned ({cluster.ca.fingerprint})" in f["ca"].message
    assert f["identity"].status == "fail"  # the certificate no longer chains to ca.crt
    assert "not issued by this cluster's CA" in f["identity"].message


async def test_no_command_signing_roots_warns_that_nothing_is_signature_checked(cluster: Cluster) -> None:
    d = cluster.node_dir("n1", roots=[])

    f = by_name(run_node_checks(d, cluster.clock.now()))["trust-bundle"]

    assert f.status == "warn"
    assert f.message == "no command-signing roots: commands and specs are not signature-checked"
    assert "--command-signing on" in f.fix


async def test_the_trust_bundle_line_says_whether_destructive_commands_need_a_quorum(cluster: Cluster) -> None:
    d = cluster.node_dir("n1")
    f = by_name(run_node_checks(d, cluster.clock.now()))["trust-bundle"]
    assert f.status == "pass" and f.message.endswith("no approvers: destructive commands run without a quorum")

    ident = Identity.load(d)
    bundle = ident.trust_bundle()
    for name in ("alice", "bob", "carol"):
        bundle.approver_keys.add(key_id=f"sha256:{name}", public_key=b"k" * 32, name=name)
    bundle.quorum_k = 2
    ident.set_trust_bundle(bundle)
    ident.save(d)
    f = by_name(run_node_checks(d, cluster.clock.now()))["trust-bundle"]
    assert f.message.endswith("destructive commands need 2 of 3 approvers")


async def test_an_expired_or_unreadable_root_fails_the_trust_bundle(cluster: Cluster) -> None:
    expired = cluster.signing_root(age_s=11 * 365 * 86400)  # roots last ten years
    d = cluster.node_dir("n1", roots=[cluster.signing_root(), expired])
    f = by_name(run_node_checks(d, cluster.clock.now()))["trust-bundle"]
    assert f.status == "fail"
    assert f.message.startswith("command-signing root 2 (sha256:") and "expired" in f.message

    d2 = cluster.node_dir("n2", roots=[b"-----BEGIN CERTIFICATE-----\nnot a cert\n-----END CERTIFICATE-----\n"])
    f2 = by_name(run_node_checks(d2, cluster.clock.now()))["trust-bundle"]
    assert (f2.status, f2.message) == ("fail", "command-signing root 1 does not parse")


async def test_a_skewed_host_clock_warns_with_the_fix(cluster: Cluster) -> None:
    d = cluster.node_dir("n1")
    now_ms = int(cluster.clock.now() * 1000)
    await make_journal(d, "n1", {"clock_offset_ms": "2500", "clock_offset_at_ms": str(now_ms - 180_000)})

    f = by_name(run_node_checks(d, cluster.clock.now()))["clock"]

    assert f.status == "warn"
    assert f.message == "this host's clock is 2500 ms behind the server's (measured 3m ago)"
    assert f.fix == "sync the host clock (chrony/timedatectl)"
    r = doctor("--data-dir", str(d))
    assert r.exit_code == 0  # a warning is not a failure
    assert "warn  clock" in r.output


async def test_the_clock_offset_is_unknown_until_the_node_has_connected(cluster: Cluster) -> None:
    d = cluster.node_dir("n1")
    await make_journal(d, "n1")

    f = by_name(run_node_checks(d, cluster.clock.now()))["clock"]

    assert f.status == "warn"
    assert "unknown until the node has connected" in f.message


async def test_a_time_mark_far_ahead_of_the_host_clock_fails(cluster: Cluster) -> None:
    now = cluster.clock.now()  # the host's clock moves on: read it once
    d = cluster.node_dir("n1", time_mark_ms=round(now * 1000) + 10 * 60_000)

    f = by_name(run_node_checks(d, now))["clock"]

    assert f.status == "fail"
    assert "is 10m ahead of this host's clock" in f.message
    assert "chrony" in f.fix


async def test_a_corrupted_journal_fails(cluster: Cluster) -> None:
    d = cluster.node_dir("n1")
    path = d / "journal.db"
    j = await Journal.open(path, "n1")
    await j.append_events([("metric", METRIC, b"x" * 3000) for _ in range(40)])
    await j.close()
    data = bytearray(path.read_bytes())
    for offset in range(4096, len(data), 4096):  # keep the header page, damage the others
        data[offset : offset + 200] = b"\xde\xad" * 100
    path.write_bytes(bytes(data))

    f = by_name(run_node_checks(d, cluster.clock.now()))["journal"]

    assert f.status == "fail"
    assert f.message.startswith(f"{path} is corrupt: ")
    assert "moves the journal aside" in f.fix and "journal-lost" in f.fix
    assert path.read_bytes() == bytes(data)  # doctor reports; bc node is the one that moves it


async def test_a_file_that_is_no_journal_fails(cluster: Cluster) -> None:
    d = cluster.node_dir("n1")
    (d / "journal.db").write_bytes(b"this is not a sqlite database " * 200)

    f = by_name(run_node_checks(d, cluster.clock.now()))["journal"]

    assert f.status == "fail"
    assert f.message.endswith("is corrupt: file is not a database")


async def test_a_journal_of_another_node_fails(cluster: Cluster) -> None:
    d = cluster.node_dir("n1")
    await make_journal(d, "n7")

    f = by_name(run_node_checks(d, cluster.clock.now()))["journal"]

    assert f.status == "fail"
    assert "belongs to node n7, not n1: bc node refuses it" in f.message


async def test_a_journal_near_its_event_bound_warns(cluster: Cluster) -> None:
    d = cluster.node_dir("n1")
    j = await Journal.open(d / "journal.db", "n1")
    await j.append_events([("metric", METRIC, b"m") for _ in range(8_500)])
    await j.close()

    f = by_name(run_node_checks(d, cluster.clock.now()))["journal"]

    assert f.status == "warn"
    assert "8,500 unacked events of 10,000" in f.message
    assert "not acknowledging events" in f.fix


async def test_an_unreachable_server_warns_that_the_node_runs_offline(cluster: Cluster) -> None:
    d = cluster.node_dir("n1", server=closed_port())

    f = by_name(run_node_checks(d, cluster.clock.now()))["server"]

    assert f.status == "warn"
    assert f.message.startswith("cannot reach the server at 127.0.0.1:")
    assert f.message.endswith("the node keeps enforcing its last spec offline")


async def test_a_server_presenting_another_ca_fails(cluster: Cluster, tmp_path: Path, clock: LoopClock) -> None:
    d = cluster.node_dir("n1")
    ident = json.loads((d / "identity.json").read_text())
    ident["ca_fingerprint"] = "sha256:" + "0" * 64
    (d / "identity.json").write_text(json.dumps(ident))

    f = by_name(run_node_checks(d, cluster.clock.now()))["server"]

    assert f.status == "fail"
    assert "does not match the join token's pin" in f.message


async def test_doctor_reads_a_live_journal_without_its_write_lock_and_changes_nothing(cluster: Cluster) -> None:
    d = await healthy(cluster)
    writer = sqlite3.connect(d / "journal.db", isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")  # bc node in the middle of a write
    try:
        before = digests(d)

        snap = read_journal(d / "journal.db")
        found = run_node_checks(d, cluster.clock.now())

        assert snap.error == "" and snap.meta["node_id"] == "n1"
        assert by_name(found)["journal"].status == "pass"
        assert digests(d) == before
    finally:
        writer.execute("ROLLBACK")
        writer.close()


async def test_doctor_leaves_no_file_behind_beside_a_stopped_node(cluster: Cluster) -> None:
    d = await healthy(cluster)
    before = digests(d)

    run_node_checks(d, cluster.clock.now())

    assert digests(d) == before  # no -wal or -shm left by a read-only connection either


async def test_an_unreadable_identity_fails_alone(tmp_path: Path) -> None:
    d = tmp_path / "node"
    d.mkdir()
    (d / "identity.json").write_text("{not json")

    found = run_node_checks(d, 0.0)

    assert [(f.name, f.status) for f in found] == [("identity", "fail")]
    assert "is unreadable" in found[0].message


def test_a_directory_that_is_neither_a_node_nor_a_server_is_bad_input(tmp_path: Path) -> None:
    r = doctor("--data-dir", str(tmp_path))
    assert r.exit_code == 2
    assert r.output == (
        f"error: {tmp_path} holds neither a node identity (identity.json) nor a bc serve data dir (pki/, bc.db)\n"
    )
    r = doctor("--data-dir", str(tmp_path / "missing"))
    assert r.exit_code == 2
    assert "is not a directory" in r.output
