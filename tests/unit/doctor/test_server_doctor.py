"""`bc doctor` on a `bc serve` data dir: CA, serving certificate, command signing, store, clock, operator config.

The data dirs hold what `bc serve` writes at its first start: a CA made by `CertificateAuthority`, signing
keys made by `SigningKeys`, a store opened (and migrated) by `open_store`, an operator config.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sqlite3
from pathlib import Path

from click.testing import CliRunner, Result
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from bc.assembly.supervisor import RESTARTING, LoopState, Supervisor, states_json
from bc.cli.main import cli
from bc.control.doctor.checks import (
    LOOPS_FILE,
    check_clock,
    check_command_signing,
    check_loops,
    check_store,
    run_server_checks,
)
from bc.control.doctor.clock_skew import ClockSkewMonitor
from bc.pki import keys, signing
from bc.pki.secrets_source import SystemSecrets
from bc.protocol.findings import Finding
from bc.runtime.files import atomic_write
from bc.seams import virtual_time
from bc.store import open_store
from bc.store.migrate import migrations
from tests.unit.doctor.doctor_helpers import Cluster, make_store

RNG = random.Random(1)  # ids and serials, as the one seeded Random of a process would give them
SECRETS = SystemSecrets()

DAY = 86400


def by_name(findings: list[Finding]) -> dict[str, Finding]:
    return {f.name: f for f in findings}


def doctor(*args: str) -> Result:
    """The CLI runs its own event loop, so the tests that call it are plain functions."""
    return CliRunner().invoke(cli, ["doctor", *args])


async def server(cluster: Cluster, **kw: bool) -> Path:
    d = cluster.server_dir(**kw)
    await make_store(d, cluster.clock)
    return d


async def test_a_server_dir_passes_every_check(cluster: Cluster) -> None:
    d = await server(cluster)

    found = await run_server_checks(d, cluster.clock)

    assert [(f.name, f.status) for f in found] == [
        ("ca", "pass"),
        ("server-certificate", "pass"),
        ("command-signing", "pass"),
        ("store", "pass"),
        ("clock", "pass"),
        ("operator-config", "pass"),
        ("loops", "pass"),
    ]
    f = by_name(found)
    assert "key mode 0600" in f["ca"].message
    assert f["command-signing"].message.startswith("on: worker key sha256:")
    latest = migrations()[-1][0]
    assert f"schema version {latest} (current)" in f["store"].message
    assert f["clock"].message == "within 0 ms of the store's clock"


def test_the_cli_on_a_server_dir_exits_zero_with_json(cluster: Cluster) -> None:
    d = asyncio.run(server(cluster))

    r = doctor("--data-dir", str(d), "--json")

    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["role"] == "server" and doc["ok"] is True
    assert [c["name"] for c in doc["checks"]] == [
        "ca",
        "server-certificate",
        "command-signing",
        "store",
        "clock",
        "operator-config",
        "loops",
    ]
    assert doc["checks"][-1]["message"].startswith("skipped: no loops.json in")  # no bc serve runs on it


def test_a_missing_ca_fails_and_the_cli_exits_9(cluster: Cluster) -> None:
    d = asyncio.run(server(cluster))
    os.remove(d / "pki" / "ca.key")

    f = by_name(asyncio.run(run_server_checks(d, cluster.clock)))["ca"]
    assert f.status == "fail"
    assert f.message == f"no ca.key in {d / 'pki'}"
    assert "a new CA cuts every one of them off" in f.fix

    r = doctor("--data-dir", str(d))
    assert r.exit_code == 9
    assert "fail  ca" in r.output
    assert r.output.splitlines()[-1] == "error: 1 check failed: ca"


async def test_a_ca_key_others_can_read_fails(cluster: Cluster) -> None:
    d = await server(cluster)
    os.chmod(d / "pki" / "ca.key", 0o644)

    f = by_name(await run_server_checks(d, cluster.clock))["ca"]

    assert f.status == "fail"
    assert "is mode 0644" in f.message
    assert f.fix == f"chmod 600 {d / 'pki' / 'ca.key'}"


async def test_command_signing_off_warns_that_nodes_accept_unsigned_commands(cluster: Cluster) -> None:
    d = await server(cluster, command_signing=False)

    f = by_name(await run_server_checks(d, cluster.clock))["command-signing"]

    assert f.status == "warn"
    assert f.message == "command signing is off: nodes accept unsigned commands and specs"
    assert "--command-signing on" in f.fix


async def test_a_worker_certificate_from_another_root_fails(cluster: Cluster) -> None:
    d = cluster.server_dir()
    _, other_root = signing.create_root(cluster.clock, RNG, SECRETS)
    (d / "pki" / "signing" / "root.crt").write_bytes(keys.cert_to_pem(other_root))

    f = check_command_signing(d, cluster.clock.now())

    assert f.status == "fail"
    assert f.message == "worker.crt was not issued by root.crt: nodes refuse everything it signs"


async def test_an_expired_worker_certificate_fails(cluster: Cluster) -> None:
    d = cluster.server_dir()
    sd = d / "pki" / "signing"
    rk = serialization.load_pem_private_key((sd / "root.key").read_bytes(), password=None)
    assert isinstance(rk, ed25519.Ed25519PrivateKey)
    root = keys.load_cert_pem((sd / "root.crt").read_bytes())
    with cluster.rewound(100 * DAY):  # workers last 90 days
        _, worker = signing.issue_worker(rk, root, cluster.clock, RNG, SECRETS)
    (sd / "worker.crt").write_bytes(keys.cert_to_pem(worker))

    f = check_command_signing(d, cluster.clock.now())

    assert f.status == "fail"
    assert f.message.startswith("the worker certificate expired 10d")
    assert "restart bc serve" in f.fix


async def test_a_missing_store_fails(cluster: Cluster) -> None:
    d = cluster.server_dir()

    found = by_name(await run_server_checks(d, cluster.clock))

    assert found["store"].status == "fail"
    assert found["store"].message == f"no store at {d / 'bc.db'}"
    assert found["clock"].status == "warn"
    assert not (d / "bc.db").exists()  # doctor never creates one


async def test_an_older_schema_warns_and_is_not_migrated_by_doctor(cluster: Cluster) -> None:
    d = await server(cluster)
    (previous, _, _), (latest, _, _) = migrations()[-2:]  # numbers may skip one (another branch's)
    with sqlite3.connect(d / "bc.db") as conn:
        conn.execute("DELETE FROM schema_version WHERE version = ?", (latest,))
    conn.close()

    f, store = await check_store(d, cluster.clock)

    assert store is None
    assert f.status == "warn"
    assert f.message == f"the store's schema is version {previous}; this bc's is {latest}"
    with sqlite3.connect(d / "bc.db") as conn:
        assert conn.execute("SELECT max(version) FROM schema_version").fetchone()[0] == previous
    conn.close()


async def test_a_newer_schema_fails(cluster: Cluster) -> None:
    d = await server(cluster)
    with sqlite3.connect(d / "bc.db") as conn:
        conn.execute("INSERT INTO schema_version (version, name, applied_at_ms) VALUES (999, 'future', 0)")
    conn.close()

    f, store = await check_store(d, cluster.clock)

    assert store is None
    assert (f.status, f.message) == (
        "fail",
        f"the store's schema is version 999, newer than this bc knows ({migrations()[-1][0]})",
    )


async def test_a_store_clock_two_seconds_off_is_a_clock_skew_finding(cluster: Cluster, tmp_path: Path) -> None:
    store_clock = cluster.clock.shifted(2.0)  # PostgreSQL's host, two seconds ahead of this one
    store = await open_store(f"sqlite-inline:{tmp_path / 'skew.db'}", store_clock)
    try:
        f = await check_clock(ClockSkewMonitor(store, cluster.clock))
    finally:
        await store.close()

    assert f.status == "warn"
    assert f.message == "ClockSkew: this host's clock is 2000 ms behind the store's (more than 1000 ms)"
    assert f.fix == "sync this host's clock (chrony/timedatectl)"


async def test_an_expired_operator_certificate_fails(cluster: Cluster) -> None:
    d = cluster.root / "old-server"
    with cluster.rewound(400 * DAY):  # operator certificates last a year
        cluster.server_dir("old-server")
    await make_store(d, cluster.clock)

    f = by_name(await run_server_checks(d, cluster.clock))["operator-config"]

    assert f.status == "fail"
    assert f.message.startswith("the operator certificate expired 35d")
    assert f.fix == f"move {d / 'operator'} aside and restart bc serve: it writes a new operator config"


async def test_a_missing_operator_config_warns(cluster: Cluster) -> None:
    d = await server(cluster)
    (d / "operator" / "config.json").unlink()

    f = by_name(await run_server_checks(d, cluster.clock))["operator-config"]

    assert f.status == "warn"
    assert "the admin commands cannot reach this server" in f.message


class Outage(Exception):
    pass


def _report_loops(data_dir: Path, *, failing: bool) -> None:
    """A real supervisor writes loops.json as `bc serve`'s does, on each change; with `failing` its `liveness`
    loop raises on a store outage and waits to restart when the file is read."""

    async def main() -> None:
        clock = virtual_time.virtual_clock()
        restarting = asyncio.Event()

        def write(states: list[LoopState]) -> None:
            atomic_write(data_dir / LOOPS_FILE, states_json("serve", clock.now(), states))
            if any(s.state == RESTARTING for s in states):
                restarting.set()

        sup = Supervisor(clock, random.Random(7), process="serve", on_change=write)

        async def liveness() -> None:
            if failing:
                raise Outage("store down: connection refused\nat line 2")
            await asyncio.Event().wait()

        sup.spawn("liveness", liveness)
        sup.spawn("jobs", asyncio.Event().wait)
        if failing:
            async with asyncio.timeout(60):
                await restarting.wait()
        else:
            await virtual_time.advance(1)
        await sup.stop()

    virtual_time.run(main())


def test_loops_pass_when_every_loop_runs_and_are_skipped_without_a_running_server(tmp_path: Path) -> None:
    assert check_loops(tmp_path).status == "pass"
    assert check_loops(tmp_path).message == f"skipped: no loops.json in {tmp_path} (a running bc serve writes it)"

    _report_loops(tmp_path, failing=False)

    f = check_loops(tmp_path)
    assert f.status == "pass"
    assert f.message.startswith("2 of 2 running as of ") and f.message.endswith(", 0 restarts since bc serve started")


def test_a_restarting_loop_warns_with_its_last_error_in_one_line_and_json_carries_it(cluster: Cluster) -> None:
    d = asyncio.run(server(cluster))
    _report_loops(d, failing=True)

    f = check_loops(d)
    assert f.status == "warn"
    assert f.message.startswith("liveness restarting since ")
    assert f.message.endswith("(1 restarts): Outage: store down: connection refused\\x0aat line 2")
    assert "\n" not in f.message and "event=loop.restarting" in f.fix

    r = doctor("--data-dir", str(d), "--json")
    assert r.exit_code == 0, r.output  # a warning: it heals itself once the store is back
    [loops] = [c for c in json.loads(r.output)["checks"] if c["name"] == "loops"]
    assert loops["status"] == "warn" and loops["message"] == f.message
