"""The simulation seam holds: production code reads no wall time, randomness or entropy outside the seams.

ARCHITECTURE.md §3: the loop's time is the only clock, one seeded `random.Random` reaches every id and
jitter, and secret material comes through a `Secrets`. A module that reads `time.time()`, draws from the
`random` module's hidden global generator, calls `uuid4()` or reads `secrets`/`os.urandom` behind the seams'
backs makes a simulated run unreplayable from its seed, and nothing else would notice. This test walks the
AST of every module under `bc/` and `agent/` (as `test_source_rules` does) and resolves imports, so
`from time import time as now; now()` is caught as well as `time.time()`.

What counts:

* wall time: `time.time`, `time.time_ns`, `time.monotonic`, `time.monotonic_ns`, `time.perf_counter`,
  `time.perf_counter_ns`, `datetime.now`, `datetime.utcnow`, `datetime.today`, `date.today` — called or
  passed on (`default_factory=time.time` reads it later);
* randomness: anything of the `random` module but the `Random` class, and `Random()` without a seed (it
  seeds itself from the OS);
* entropy: `uuid.uuid1`, `uuid.uuid4`, anything of `secrets`, `os.urandom`.

The loop's own time (`loop.time()`) is the clock, and `random.Random(seed)` is how the one Random is made:
neither is flagged.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("bc", "agent", "tui")

WALL_TIME = {
    "time.time",
    "time.time_ns",
    "time.monotonic",
    "time.monotonic_ns",
    "time.perf_counter",
    "time.perf_counter_ns",
    "datetime.datetime.now",
    "datetime.datetime.utcnow",
    "datetime.datetime.today",
    "datetime.date.today",
}
ENTROPY = {"uuid.uuid1", "uuid.uuid4", "os.urandom"}
ENTROPY_MODULES = ("secrets",)
RANDOM_CLASS = "random.Random"

ALLOWED: dict[str, str] = {
    "bc/seams/clock.py": "the production clock: the wall offset the loop's time is read against",
    "bc/pki/secrets_source.py": "the Secrets seam, and the one place production seeds its Random from the OS",
    "bc/cli/demo.py": "`make demo` drives real subprocesses as an operator would: its deadlines are wall time",
    "agent/doctor.py": "`bc doctor` times a real TLS handshake for the operator; it never runs simulated",
}
"""The seams themselves, each with why. Anything else reading the world is an offender."""


def _dotted(node: ast.expr) -> list[str] | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return parts[::-1]


def _imports(tree: ast.AST) -> dict[str, str]:
    """Local name -> what it names, for the modules this rule is about (`from time import time` -> time.time)."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                names[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


def _verdict(qualified: str, call: ast.Call | None) -> str | None:
    if qualified in WALL_TIME:
        return "reads wall time"
    if qualified in ENTROPY or qualified.split(".")[0] in ENTROPY_MODULES:
        return "reads entropy"
    if qualified == RANDOM_CLASS:
        if call is not None and not call.args and not call.keywords:
            return "makes a Random seeded from the OS"
        return None
    if qualified.startswith("random."):
        return "draws from the random module's global generator"
    return None


def offenders(tree: ast.AST) -> list[tuple[int, str, str]]:
    """(line, name, why) for every read of the world outside the seams."""
    imported = _imports(tree)
    calls = {id(n.func): n for n in ast.walk(tree) if isinstance(n, ast.Call)}
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute | ast.Name) or id(node) in inner:
            continue  # only the whole chain (`datetime.datetime.now`), not its prefixes
        parts = _dotted(node)
        if parts is None or parts[0] not in imported:
            continue
        qualified = ".".join([imported[parts[0]], *parts[1:]])
        why = _verdict(qualified, calls.get(id(node)))
        if why is not None:
            found.append((node.lineno, qualified, why))
    return sorted(found)


def _sources() -> list[Path]:
    out: list[Path] = []
    for pkg in PACKAGES:
        out += [p for p in (ROOT / pkg).rglob("*.py") if "_pb2" not in p.name]
    return sorted(out)


def test_production_code_reads_the_world_only_through_the_seams() -> None:
    bad = []
    for path in _sources():
        rel = path.relative_to(ROOT).as_posix()
        if rel in ALLOWED:
            continue
        for line, name, why in offenders(ast.parse(path.read_text(encoding="utf-8"), filename=rel)):
            bad.append(f"{rel}:{line} {why} ({name})")
    assert not bad, "pass the clock, the Random or the Secrets in instead:\n" + "\n".join(bad)


def test_every_allowed_module_exists_and_still_needs_its_place() -> None:
    """An allowance outliving its reason would hide the next offender in that module."""
    for rel in ALLOWED:
        path = ROOT / rel
        assert path.is_file(), rel
        assert offenders(ast.parse(path.read_text(encoding="utf-8"))), f"{rel} reads nothing now: drop it"


def test_the_rule_catches_what_it_is_for() -> None:
    bad = ast.parse(
        "import time, random, uuid, secrets, os\n"
        "import datetime as dt\n"
        "from datetime import datetime, date\n"
        "from time import monotonic as mono\n"
        "from random import choice\n"
        "from dataclasses import field\n"
        "a = time.time()\n"
        "b = dt.datetime.now()\n"
        "c = datetime.utcnow()\n"
        "d = date.today()\n"
        "e = mono()\n"
        "f = random.randint(1, 6)\n"
        "g = choice([1, 2])\n"
        "h = random.Random()\n"
        "i = random.SystemRandom()\n"
        "j = uuid.uuid4()\n"
        "k = secrets.token_hex(8)\n"
        "l = os.urandom(8)\n"
        "m = field(default_factory=time.monotonic)\n"
    )
    assert [line for line, _, _ in offenders(bad)] == list(range(7, 20))


def test_the_rule_lets_the_seams_be_used() -> None:
    good = ast.parse(
        "import asyncio, random, time\n"
        "from datetime import UTC, datetime\n"
        "def f(rng: random.Random, secrets, clock) -> None:\n"
        "    r = random.Random(7)\n"
        "    asyncio.get_running_loop().time()\n"
        "    secrets.token_hex(4)\n"  # a parameter named like the module is the injected Secrets
        "    datetime.fromtimestamp(clock.now(), UTC)\n"
        "    time.sleep\n"
    )
    assert offenders(good) == []
