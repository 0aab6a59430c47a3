"""`bc doctor` on a `bc serve` data dir: CA, certificates, command signing, the store, the clock.

The file checks are plain functions of the data dir and the time; the store
and clock checks are async because the store is. Doctor may run beside a
live `bc serve`: it reads files, reads the schema version through a
read-only connection, and opens the store only when its schema is current,
so opening it migrates nothing.

The checks, in the order they print: `ca`, `server-certificate`,
`command-signing`, `store`, `clock`, `operator-config`, `loops`.
"""

from __future__ import annotations

import json
import sqlite3
import stat
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature

from bc.control.doctor.clock_skew import ClockSkewMonitor
from bc.errors import UsageError
from bc.pki import keys, signing
from bc.pki.ca import CA_CERT_FILE, CA_KEY_FILE
from bc.protocol.findings import Finding, failed, lifetime_left, passed, read_only_sqlite, span, utc_text, warned
from bc.protocol.text_safety import one_line
from bc.runtime.config import OperatorConfig
from bc.seams.clock import Clock
from bc.store import Store, StoreError, open_store
from bc.store.migrate import migrations, schema_version_of

STORE_FILE = "bc.db"  # what `bc serve` opens in its data dir
PKI_DIR = "pki"
SERVER_CERT_FILE = "server.crt"
CA_WARN_FRACTION = 0.1  # a new CA means every node joins again: a decade's last year is the time to plan it
LEAF_WARN_S = 30 * 24 * 3600
SYNC_CLOCK = "sync this host's clock (chrony/timedatectl)"
LOOPS_FILE = "loops.json"
"""Written by a running `bc serve` at each change of its loops' states (`bc.assembly.supervisor.states_json`),
removed when it stops: {"process", "at", "loops": [{"name", "state", "since", "restarts", "last_error"}]}."""


def is_server_dir(data_dir: Path) -> bool:
    return (data_dir / PKI_DIR).is_dir() or (data_dir / STORE_FILE).is_file()


# -- files --------------------------------------------------------------------


def check_ca(data_dir: Path, now: float) -> Finding:
    pki = data_dir / PKI_DIR
    key_path, cert_path = pki / CA_KEY_FILE, pki / CA_CERT_FILE
    missing = [p.name for p in (cert_path, key_path) if not p.is_file()]
    if missing:
        return failed(
            "ca",
            f"no {' and no '.join(missing)} in {pki}",
            "restore pki/ from a backup if nodes have joined this cluster (a new CA cuts every one of them off);"
            " a new install gets its CA at the first start of bc serve",
        )
    mode = stat.S_IMODE(key_path.stat().st_mode)
    if mode & 0o077:
        return failed(
            "ca",
            f"{key_path} is mode {mode:04o}: other users of this host can read the key that issues every identity",
            f"chmod 600 {key_path}",
        )
    try:
        key = keys.load_key_pem(key_path.read_bytes())
        cert = keys.load_cert_pem(cert_path.read_bytes())
    except (OSError, UsageError) as e:
        return failed("ca", f"the CA in {pki} is unreadable: {_why(e)}", "restore pki/ from a backup")
    if cert.public_key() != key.public_key():
        return failed("ca", f"{key_path.name} does not match {cert_path.name}", "restore pki/ from a backup")
    life = lifetime_left(cert, now)
    fp = keys.fingerprint(cert)
    if life.expired:
        return failed(
            "ca",
            f"the CA {fp[:19]}… expired {span(life.left_s)} ago: no node or operator certificate is valid",
            "the cluster needs a new CA, and every node a new join",
        )
    where = f"CA {fp[:19]}… valid until {utc_text(life.not_after)}, key mode {mode:04o}"
    if life.fraction_left < CA_WARN_FRACTION:
        return warned(
            "ca",
            f"{where}: {span(life.left_s)} left",
            "plan a new CA before it expires: every node will have to join again",
        )
    return passed("ca", where)


def check_server_certificate(data_dir: Path, now: float) -> Finding:
    path = data_dir / PKI_DIR / SERVER_CERT_FILE
    if not path.is_file():
        return passed("server-certificate", "none on disk: bc serve issues a new one (valid 1 year) at every start")
    try:
        cert = keys.load_cert_pem(path.read_bytes())
    except (OSError, UsageError) as e:
        return failed("server-certificate", f"{path} is unreadable: {_why(e)}", "restart bc serve to issue a new one")
    life = lifetime_left(cert, now)
    restart = "restart bc serve: it issues a new serving certificate at start"
    if life.expired:
        return failed(
            "server-certificate",
            f"the serving certificate expired {span(life.left_s)} ago: nodes and operators cannot connect",
            restart,
        )
    where = f"valid until {utc_text(life.not_after)} ({span(life.left_s)} left)"
    if life.left_s < LEAF_WARN_S:
        return warned("server-certificate", where, restart)
    return passed("server-certificate", where)


def check_command_signing(data_dir: Path, now: float) -> Finding:
    d = data_dir / PKI_DIR / signing.SIGNING_DIR
    root_path, worker_path = d / signing.ROOT_CERT, d / signing.WORKER_CERT
    if not root_path.exists() and not worker_path.exists():
        return warned(
            "command-signing",
            "command signing is off: nodes accept unsigned commands and specs",
            "restart bc serve once with --command-signing on; nodes take the signing root when they next connect",
        )
    try:
        root = x509.load_pem_x509_certificate(root_path.read_bytes())
        worker = x509.load_pem_x509_certificate(worker_path.read_bytes())
    except (OSError, ValueError) as e:
        return failed("command-signing", f"the signing certificates in {d} are unreadable: {_why(e)}", _RESTORE)
    try:
        worker.verify_directly_issued_by(root)
    except (ValueError, TypeError, InvalidSignature):
        return failed(
            "command-signing",
            f"{worker_path.name} was not issued by {root_path.name}: nodes refuse everything it signs",
            _RESTORE,
        )
    root_key_here = (d / signing.ROOT_KEY).exists()
    rotate = (
        "restart bc serve: it rotates a worker key that is due at start"
        if root_key_here
        else "the root key is off this host: run bc pki rotate --root-key FILE with the exported root"
    )
    for what, cert in (("command-signing root", root), ("worker certificate", worker)):
        life = lifetime_left(cert, now)
        if life.expired:
            return failed(
                "command-signing",
                f"the {what} expired {span(life.left_s)} ago: nodes refuse every command and spec it signs",
                rotate if cert is worker else "the nodes need a new command-signing root",
            )
    life = lifetime_left(worker, now)
    where = f"on: worker key {signing.key_id_of(worker)[:19]}… valid until {utc_text(life.not_after)}"
    if life.left_s < signing.WORKER_ROTATE_BEFORE_S:
        return warned(
            "command-signing",
            f"{where}, {span(life.left_s)} left",
            f"restart bc serve: it rotates a worker key with less than {span(signing.WORKER_ROTATE_BEFORE_S)} left"
            if root_key_here
            else rotate,
        )
    return passed("command-signing", where)


_RESTORE = "restore pki/signing/ from a backup"


def check_operator_config(data_dir: Path, now: float) -> Finding:
    path = data_dir / "operator" / "config.json"
    reissue = f"move {path.parent} aside and restart bc serve: it writes a new operator config"
    if not path.is_file():
        return warned("operator-config", f"no {path}: the admin commands cannot reach this server", reissue)
    try:
        cfg = OperatorConfig.load(path)
        cert = keys.load_cert_pem(cfg.cert_pem)
        ca = keys.load_cert_pem((data_dir / PKI_DIR / CA_CERT_FILE).read_bytes())
    except (OSError, UsageError) as e:
        return failed("operator-config", _why(e), reissue)
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return failed("operator-config", "the operator certificate was not issued by this server's CA", reissue)
    life = lifetime_left(cert, now)
    if life.expired:
        return failed("operator-config", f"the operator certificate expired {span(life.left_s)} ago", reissue)
    where = f"{path} for {cfg.server}, certificate valid until {utc_text(life.not_after)}"
    if life.left_s < LEAF_WARN_S:
        return warned("operator-config", f"{where} ({span(life.left_s)} left)", reissue)
    return passed("operator-config", where)


def check_loops(data_dir: Path) -> Finding:
    """The running `bc serve`'s loops as its supervisor last reported them: a warning for each one restarting
    (a store outage, a bug), with its last error; skipped (passed, saying why) when no bc serve runs here."""
    path = data_dir / LOOPS_FILE
    try:
        doc = json.loads(path.read_text("utf-8"))
        at = float(doc["at"])
        loops = [
            (str(lp["name"]), str(lp["state"]), float(lp["since"]), int(lp["restarts"]), str(lp["last_error"]))
            for lp in doc["loops"]
        ]
    except FileNotFoundError:
        return passed("loops", f"skipped: no {LOOPS_FILE} in {data_dir} (a running bc serve writes it)")
    except (OSError, ValueError, KeyError, TypeError) as e:
        return warned("loops", f"{path} is unreadable: {one_line(str(e))}", "restart bc serve: it writes the file anew")
    restarting = [lp for lp in loops if lp[1] == "restarting"]
    restarts = sum(lp[3] for lp in loops)
    if restarting:
        said = "; ".join(
            f"{name} restarting since {utc_text(since)} ({n} restarts): {one_line(error)}"
            for name, _, since, n, error in restarting
        )
        return warned(
            "loops",
            said,
            "see the error: a store outage heals itself once the store is back (bc serve's log: event=loop.restarting)",
        )
    running = sum(1 for lp in loops if lp[1] == "running")
    return passed(
        "loops", f"{running} of {len(loops)} running as of {utc_text(at)}, {restarts} restarts since bc serve started"
    )


def _why(e: Exception) -> str:
    if isinstance(e, UsageError):
        return e.message
    if isinstance(e, OSError):
        return f"{e.filename or ''}: {e.strerror or e}".strip(": ")
    return str(e)


# -- the store and the clock --------------------------------------------------


def read_schema_version(path: Path) -> int:
    """The store's schema version, read without migrating anything (`open_store` would migrate)."""
    conn = read_only_sqlite(path)
    try:
        return schema_version_of(conn)
    finally:
        conn.close()


async def check_store(data_dir: Path, clock: Clock) -> tuple[Finding, Store | None]:
    """The store's finding, and the store, open, when its schema is current (the caller closes it)."""
    path = data_dir / STORE_FILE
    if not path.is_file():
        return failed("store", f"no store at {path}", "a new install gets one at the first start of bc serve"), None
    latest = migrations()[-1][0]
    try:
        version = read_schema_version(path)
    except sqlite3.Error as e:
        return failed("store", f"{path} is not a readable bc store: {e}", "restore bc.db from a backup"), None
    if version > latest:
        return failed(
            "store",
            f"the store's schema is version {version}, newer than this bc knows ({latest})",
            "run bc doctor and bc serve from the newer bc",
        ), None
    if version < latest:
        return warned(
            "store",
            f"the store's schema is version {version}; this bc's is {latest}",
            "start bc serve from this bc: it migrates the store at start",
        ), None
    try:
        store = await open_store(str(path), clock)
    except StoreError as e:
        return failed("store", str(e), "check the file's permissions and free disk space"), None
    try:
        now = await store.now()
    except StoreError as e:
        await store.close()
        return failed("store", f"{store.description} does not answer: {e}", "check the store"), None
    return passed("store", f"{store.description}, schema version {version} (current), clock {utc_text(now)}"), store


async def check_clock(monitor: ClockSkewMonitor) -> Finding:
    try:
        offset_ms = await monitor.sample()
    except StoreError as e:
        return warned("clock", f"the store's clock cannot be read: {e}", "see `store`")
    direction = "behind" if offset_ms > 0 else "ahead of"
    if monitor.skewed:
        return warned(
            "clock",
            f"ClockSkew: this host's clock is {abs(offset_ms)} ms {direction} the store's"
            f" (more than {monitor.threshold_ms} ms)",
            SYNC_CLOCK,
        )
    return passed("clock", f"within {abs(offset_ms)} ms of the store's clock")


async def run_server_checks(data_dir: Path, clock: Clock) -> list[Finding]:
    now = clock.now()
    findings = [
        check_ca(data_dir, now),
        check_server_certificate(data_dir, now),
        check_command_signing(data_dir, now),
    ]
    store_finding, store = await check_store(data_dir, clock)
    findings.append(store_finding)
    if store is None:
        findings.append(warned("clock", "not measured: the store was not opened", "see `store`"))
    else:
        try:
            findings.append(await check_clock(ClockSkewMonitor(store, clock)))
        finally:
            await store.close()
    findings.append(check_operator_config(data_dir, now))
    findings.append(check_loops(data_dir))
    return findings
