"""What `bc doctor` reports: one `Finding` per check, `pass`, `warn` or `fail`, with the fix.

Both ends build findings (the node's checks in `agent.doctor`, the server's in
`bc.control.doctor.checks`), so this module sits below both and imports nothing of
either: the agent may import it. A warning is something to look at while
everything still works; a failure is something that does not work now, or
will not once the node or server restarts.

Certificates are judged the same way everywhere, by the share of their
lifetime that is left (`lifetime_left`), and both ends read an SQLite file
without touching it (`read_only_sqlite`), so those live here too.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from cryptography import x509

Status = Literal["pass", "warn", "fail"]

PASS: Status = "pass"
WARN: Status = "warn"
FAIL: Status = "fail"


@dataclass(frozen=True)
class Finding:
    name: str
    status: Status
    message: str
    fix: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def passed(name: str, message: str) -> Finding:
    return Finding(name, PASS, message)


def warned(name: str, message: str, fix: str) -> Finding:
    return Finding(name, WARN, message, fix)


def failed(name: str, message: str, fix: str) -> Finding:
    return Finding(name, FAIL, message, fix)


def ok(findings: Iterable[Finding]) -> bool:
    """Warnings are fine; one failure is not."""
    return all(f.status != FAIL for f in findings)


@dataclass(frozen=True)
class Lifetime:
    not_before: float
    not_after: float
    left_s: float  # negative once expired
    fraction_left: float  # of the whole validity window, clamped to [0, 1]

    @property
    def expired(self) -> bool:
        return self.left_s < 0

    @property
    def total_s(self) -> float:
        return self.not_after - self.not_before


def lifetime_left(cert: x509.Certificate, now: float) -> Lifetime:
    nb = cert.not_valid_before_utc.timestamp()
    na = cert.not_valid_after_utc.timestamp()
    total = max(na - nb, 1.0)
    return Lifetime(nb, na, na - now, min(1.0, max(0.0, (na - now) / total)))


def span(seconds: float) -> str:
    """A duration as its two largest units (`3h12m`, `45s`, `12d4h`); for messages on either end."""
    rest = max(0, int(abs(seconds)))
    if rest == 0:
        return "0s"
    parts: list[str] = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        n, rest = divmod(rest, size)
        if n:
            parts.append(f"{n}{unit}")
        if len(parts) == 2 or (parts and not n):
            break
    return "".join(parts)


def size_text(n: int) -> str:
    """Bytes as `512 B`, `36.0 KiB`, `12.3 MiB`."""
    size = float(n)
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def utc_text(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def read_only_sqlite(path: Path) -> sqlite3.Connection:
    """A connection that neither writes nor leaves a file behind, beside a live writer or not.

    A `mode=ro` connection to a WAL database creates `-wal` and `-shm` files when none exist and
    cannot delete them on close. Without a `-wal` file no process has the database open (its last
    connection removed it), so the file alone is the whole database and is read as immutable; with
    one, a writer may be live and `mode=ro` reads through its WAL without taking the write lock.
    """
    uri = path.resolve().as_uri()
    if Path(f"{path}-wal").exists():
        return sqlite3.connect(f"{uri}?mode=ro", uri=True, timeout=5.0)
    return sqlite3.connect(f"{uri}?immutable=1", uri=True)
