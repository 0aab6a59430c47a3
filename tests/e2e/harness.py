"""A black-box lab for the end-to-end tests: the installed `bc` run as subprocesses.

It does what an operator does and nothing more: `bc serve` in a temp dir, `bc token
create` / `bc join` / `bc node` for each node, admin commands that find the server
through `$BC_DATA_DIR`, and state read back through `bc ... --json`. It imports
nothing from `bc` or `agent`, so it tests the contract, not the code.

Every process is started in its own session (so a signal reaches it and anything it
spawned) with its output in `<root>/<name>.log`; `close()` stops them all, SIGTERM then
SIGKILL. Waiting is always on observable state (`wait_for` polls a predicate against a
deadline), never a bare sleep.
"""

from __future__ import annotations

import contextlib
import json as jsonlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[2]
SHARED_CDI_SCHEMA = REPO.parent / "shared" / "cdi-schema"
BUNDLED_CDI_SCHEMA = REPO / "agent" / "hw" / "cdi_schema"

#: Heartbeats every second on both ends keep the tests fast.
HEARTBEAT_S = 1.0


def bc_executable() -> str:
    """The installed entry point: next to the running interpreter, else the repo's venv."""
    for candidate in (Path(sys.executable).parent / "bc", REPO / ".venv" / "bin" / "bc"):
        if candidate.exists():
            return str(candidate)
    raise RuntimeError("no installed `bc` entry point next to the interpreter or in .venv")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class BcError(Exception):
    """`bc` exited non-zero; carries the whole result for assertions."""

    def __init__(self, argv: list[str], result: subprocess.CompletedProcess[str]) -> None:
        self.argv = argv
        self.result = result
        super().__init__(
            f"`bc {' '.join(argv)}` exited {result.returncode}: "
            f"stderr={result.stderr.strip()[-600:]!r} stdout={result.stdout.strip()[-200:]!r}"
        )


class WaitTimeout(AssertionError):
    """`wait_for` ran out of time; says what it waited for and what it last saw."""


@dataclass
class Proc:
    name: str
    argv: list[str]
    log_path: Path
    popen: subprocess.Popen[bytes]
    port: int | None = None
    extra_env: dict[str, str] = field(default_factory=dict)


class Lab:
    """One control plane (and maybe a spare), its nodes, in `root`; `close()` tears it all down."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.bc_path = bc_executable()
        self.home = root / "home"
        self.home.mkdir(parents=True, exist_ok=True)
        self.server_dir = root / "server"
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.procs: dict[str, Proc] = {}
        base = {k: v for k, v in os.environ.items() if not k.startswith("BC_")}
        self.env: dict[str, str] = {**base, "HOME": str(self.home), "BC_DATA_DIR": str(self.server_dir)}

    # -- processes ---------------------------------------------------------------

    def spawn(self, name: str, *args: str, port: int | None = None, env: Mapping[str, str] | None = None) -> Proc:
        return self._start(name, [self.bc_path, *args], port, env)

    def spawn_module(self, name: str, module: str, *args: str, env: Mapping[str, str] | None = None) -> Proc:
        """`python -m MODULE ARGS` from this checkout: a test's helper process (e.g. tests.e2e.fleet_agents),
        logged to `<root>/<name>.log` and stopped by `close()` like every other."""
        pythonpath = os.pathsep.join(p for p in (str(REPO), self.env.get("PYTHONPATH", "")) if p)
        return self._start(name, [sys.executable, "-m", module, *args], None, {"PYTHONPATH": pythonpath, **(env or {})})

    def _start(self, name: str, argv: list[str], port: int | None, env: Mapping[str, str] | None) -> Proc:
        if name in self.procs and self.procs[name].popen.poll() is None:
            raise RuntimeError(f"{name} is already running")
        log_path = self.root / f"{name}.log"
        extra = dict(env or {})
        with open(log_path, "ab") as log:
            log.write(f"--- lab: start {' '.join(argv[1:])}\n".encode())
            log.flush()
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**self.env, **extra},
                start_new_session=True,
            )
        proc = Proc(name, argv, log_path, popen, port, extra)
        self.procs[name] = proc
        if port is not None:
            self._wait_listening(proc)
        return proc

    def _wait_listening(self, proc: Proc) -> None:
        assert proc.port is not None

        def up() -> bool:
            if proc.popen.poll() is not None:
                raise RuntimeError(f"{proc.name} exited {proc.popen.returncode}:\n{self.log(proc.name)[-2000:]}")
            return port_accepts(proc.port)  # type: ignore[arg-type]

        self.wait_for(f"{proc.name} to accept connections on port {proc.port}", up, timeout=20)

    def copy_server_dir(self, dest: Path) -> Path:
        """A copy of the running server's data dir for another gateway (the fleet's CA and keys): without its
        logs and what belongs to the running process alone (its loops report, a file being written)."""
        shutil.copytree(self.server_dir, dest, ignore=shutil.ignore_patterns("*.log", "loops.json", ".bc-tmp-*"))
        return dest

    def serve(
        self,
        name: str = "serve",
        data_dir: Path | None = None,
        port: int | None = None,
        store: str = "",
        *extra: str,
    ) -> Proc:
        """`bc serve` with fast heartbeats (on the store URL `store` if given); returns once its port accepts."""
        data_dir = data_dir or self.server_dir
        port = port or self.port
        return self.spawn(
            name,
            "serve",
            *(("--store", store) if store else ()),
            *extra,
            "--data-dir",
            str(data_dir),
            "--listen",
            f"127.0.0.1:{port}",
            "--heartbeat-interval",
            str(HEARTBEAT_S),
            port=port,
            env={"BC_DATA_DIR": str(data_dir)},
        )

    def node_dir(self, node_id: str) -> Path:
        return self.root / f"node-{node_id}"

    def cdi_dir(self, node_id: str) -> Path:
        return self.node_dir(node_id) / "cdi"

    def cdi_path(self, node_id: str, allocation_id: str) -> Path:
        return self.cdi_dir(node_id) / f"bc-{allocation_id}.json"

    def token(self, node_id: str, *extra: str, server_dir: Path | None = None) -> str:
        """`bc token create`; the token is the last line printed."""
        env = {"BC_DATA_DIR": str(server_dir)} if server_dir else None
        out = self.bc("token", "create", "--node-id", node_id, *extra, json=False, env=env)
        return str(out).strip().splitlines()[-1].strip()

    def join(self, node_id: str, token: str | None = None) -> Any:
        token = token or self.token(node_id)
        return self.bc("join", "--server", self.address, "--token", token, "--data-dir", str(self.node_dir(node_id)))

    def node(
        self, node_id: str, profile: str = "hgx-h100-8", env: Mapping[str, str] | None = None, extra: Sequence[str] = ()
    ) -> Proc:
        """`bc node` for a joined node; `env` goes to this process only (e.g. the `BC_FAKE_*` knobs); `extra`: flags.

        `restart` reuses it; to start the node again without it, call `node` again once it has stopped.
        """
        return self.spawn(
            f"node-{node_id}",
            "node",
            "--data-dir",
            str(self.node_dir(node_id)),
            "--fake-hw",
            profile,
            "--heartbeat-interval",
            str(HEARTBEAT_S),
            *extra,
            env=env,
        )

    def kill(self, name: str, sig: int = signal.SIGKILL, timeout: float = 10.0) -> int | None:
        """Signal a process's session and reap it; returns its exit code."""
        proc = self.procs[name]
        if proc.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.popen.pid, sig)
            proc.popen.wait(timeout=timeout)
        return proc.popen.returncode

    def restart(self, name: str) -> Proc:
        """Start a stopped process again with the same arguments (and wait for its port)."""
        old = self.procs[name]
        if old.popen.poll() is None:
            raise RuntimeError(f"{name} is still running; kill it first")
        return self.spawn(name, *old.argv[1:], port=old.port, env=old.extra_env)

    def running(self, name: str) -> bool:
        return name in self.procs and self.procs[name].popen.poll() is None

    def log(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def logs_with(self, needle: str) -> dict[str, str]:
        """Each process log that contains `needle`, by name."""
        return {name: self.log(name) for name in self.procs if needle in self.log(name)}

    def dump_logs(self, tail: int = 4000) -> str:
        parts = [f"===== {name}.log (last {tail} chars) =====\n{self.log(name)[-tail:]}" for name in self.procs]
        return "\n".join(parts)

    def close(self) -> None:
        """SIGTERM everything, give it a few seconds, then SIGKILL what is left."""
        for proc in self.procs.values():
            if proc.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5.0
        for proc in self.procs.values():
            try:
                proc.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.popen.pid, signal.SIGKILL)
                proc.popen.wait(timeout=10)

    # -- the CLI -----------------------------------------------------------------

    def run(
        self, *args: str, env: Mapping[str, str] | None = None, timeout: float = 30.0
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.bc_path, *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env={**self.env, **(env or {})},
            timeout=timeout,
        )

    def bc(self, *args: str, json: bool = True, env: Mapping[str, str] | None = None, timeout: float = 30.0) -> Any:
        """Run `bc ARGS` (with `--json` unless json=False); raise BcError with stderr on non-zero."""
        argv = [*args, "--json"] if json else list(args)
        result = self.run(*argv, env=env, timeout=timeout)
        if result.returncode != 0:
            raise BcError(argv, result)
        if not json:
            return result.stdout
        try:
            return jsonlib.loads(result.stdout)
        except jsonlib.JSONDecodeError as e:
            raise AssertionError(f"`bc {' '.join(argv)}` did not print JSON: {result.stdout[:300]!r}") from e

    # -- waiting -----------------------------------------------------------------

    def wait_for(
        self, description: str, predicate: Callable[[], T | None], timeout: float = 20.0, interval: float = 0.05
    ) -> T:
        """Poll `predicate` until it returns something truthy; return that.

        A `BcError` from the predicate (the CLI failing, e.g. while the server restarts)
        counts as "not yet" and is kept as the last observed value.
        """
        deadline = time.monotonic() + timeout
        last: object = None
        while True:
            try:
                value = predicate()
            except BcError as e:
                last = e
            else:
                if value:
                    return value
                last = value
            if time.monotonic() >= deadline:
                raise WaitTimeout(f"timed out after {timeout:.1f}s waiting for {description}; last: {last!r}")
            time.sleep(interval)

    # -- reading state -----------------------------------------------------------

    def show(self, node_id: str) -> dict[str, Any]:
        doc = self.bc("nodes", "show", node_id)
        assert isinstance(doc, dict), doc
        return doc

    def wait_converged(self, node_id: str, generation: int | None = None, timeout: float = 20.0) -> dict[str, Any]:
        """Wait until the node is connected with observed_generation == generation > 0 (== `generation` if given)."""
        seen: list[dict[str, Any]] = []

        def check() -> dict[str, Any] | None:
            doc = self.show(node_id)
            seen.append(_brief(doc))
            return converged(doc, generation)

        at = f" at generation {generation}" if generation is not None else ""
        try:
            return self.wait_for(f"{node_id} connected with observed_generation == generation{at}", check, timeout)
        except WaitTimeout as e:
            raise WaitTimeout(f"{e}; last node state: {seen[-1] if seen else None}") from None

    def reservation(self, reservation_id: str) -> dict[str, Any] | None:
        for r in self.bc("reservations", "--all"):
            if r.get("id") == reservation_id:
                assert isinstance(r, dict)
                return r
        return None

    def wait_reservation_state(self, reservation_id: str, state: str, timeout: float = 20.0) -> dict[str, Any]:
        last: list[Any] = [None]

        def check() -> dict[str, Any] | None:
            r = self.reservation(reservation_id)
            last[0] = r and r.get("state")
            return r if r and r.get("state") == state else None

        try:
            return self.wait_for(f"reservation {reservation_id} {state}", check, timeout)
        except WaitTimeout as e:
            raise WaitTimeout(f"{e}; its state: {last[0]!r}") from None

    # -- jobs and the event log ---------------------------------------------------

    def job(self, dag_id: str) -> dict[str, Any]:
        """`bc jobs show DAG --json`: the DAG document (keys in docs/jobs.md)."""
        doc = self.bc("jobs", "show", dag_id)
        assert isinstance(doc, dict) and doc.get("id") == dag_id, doc
        return doc

    def wait_job(
        self, dag_id: str, description: str, predicate: Callable[[dict[str, Any]], bool], timeout: float = 30.0
    ) -> dict[str, Any]:
        """Poll `bc jobs show` until `predicate(doc)`; the timeout says which node states it went through."""
        seen: list[str] = []

        def check() -> dict[str, Any] | None:
            doc = self.job(dag_id)
            brief = job_brief(doc)
            if not seen or seen[-1] != brief:
                seen.append(brief)
            return doc if predicate(doc) else None

        try:
            return self.wait_for(f"job {dag_id}: {description}", check, timeout)
        except WaitTimeout as e:
            shown = seen[-4:]
            raise WaitTimeout(f"{e}; its last states ({len(seen)} seen):\n  " + "\n  ".join(shown)) from None

    def wait_job_terminal(self, dag_id: str, timeout: float = 60.0) -> dict[str, Any]:
        return self.wait_job(dag_id, "terminal", lambda d: bool(d.get("terminal")), timeout)

    def events(self, type_prefix: str = "", after: int = 0) -> list[dict[str, Any]]:
        """Every event after `after` whose type starts with `type_prefix` (`bc events --json`, page by page)."""
        out: list[dict[str, Any]] = []
        while True:
            page = self.bc("events", "--type", type_prefix, "--after", str(after), "--limit", "10000")
            if not page:
                return out
            out.extend(page)
            after = int(page[-1]["seq"])


def job_node(doc: dict[str, Any], node_id: str) -> dict[str, Any]:
    """One node of a DAG document, by id."""
    for n in doc["nodes"]:
        if n["id"] == node_id:
            assert isinstance(n, dict)
            return n
    raise AssertionError(f"job {doc.get('id')} has no node {node_id!r}: {[n['id'] for n in doc['nodes']]}")


def job_brief(doc: dict[str, Any]) -> str:
    """`j-… failed(terminal): batch=running reset:n1=queued …`: a DAG in one line, for failure messages."""
    nodes = " ".join(f"{n['id']}={n['state']}" + (f"({n['error']})" if n.get("error") else "") for n in doc["nodes"])
    terminal = "(terminal)" if doc.get("terminal") else ""
    error = f" first_error={doc['first_error']!r}" if doc.get("first_error") else ""
    return f"{doc['id']} {doc['state']}{terminal}{error}: {nodes}"


# -- the fake hardware's side effects, counted by the node in its data dir (agent/hw/fake.py) ------------


def fake_resets(lab: Lab, node_id: str) -> dict[str, int]:
    """GPU resets the fake node started, by GPU uuid (`fake-gpu-resets.json`)."""
    path = lab.node_dir(node_id) / "fake-gpu-resets.json"
    data = jsonlib.loads(path.read_text()) if path.exists() else {}
    return {str(k): int(v) for k, v in data.items()}


def fake_reboots(lab: Lab, node_id: str) -> int:
    """Fake reboots the node started (`fake-reboots.json`), each counted before the process re-executes."""
    path = lab.node_dir(node_id) / "fake-reboots.json"
    return int(jsonlib.loads(path.read_text()).get("reboots", 0)) if path.exists() else 0


def fake_boot_id(lab: Lab, node_id: str) -> str:
    path = lab.node_dir(node_id) / "fake-boot-id"
    return path.read_text().strip() if path.exists() else ""


def converged(doc: dict[str, Any], generation: int | None = None) -> dict[str, Any] | None:
    """`doc` (a `bc nodes show --json`) if connected with observed == generation > 0 (== `generation` if given)."""
    g, o = doc.get("generation"), doc.get("observed_generation")
    ok = doc.get("state") == "connected" and isinstance(g, int) and g > 0 and g == o
    if generation is not None:
        ok = ok and g == generation
    return doc if ok else None


def _brief(doc: dict[str, Any]) -> dict[str, Any]:
    keys = ("state", "generation", "applied_generation", "observed_generation", "session_epoch")
    return {k: doc.get(k) for k in keys}


# -- CDI -------------------------------------------------------------------------


def cdi_schema_dir() -> Path:
    """The shared copy of the official CDI schema, else the one bundled with the agent."""
    if (SHARED_CDI_SCHEMA / "schema.json").exists() and (SHARED_CDI_SCHEMA / "defs.json").exists():
        return SHARED_CDI_SCHEMA
    return BUNDLED_CDI_SCHEMA


def cdi_problems(doc: Any) -> list[str]:
    """Everything wrong with a CDI spec: schema errors, device names with '/', a kind that is not vendor/class."""
    import referencing.jsonschema
    from jsonschema import Draft7Validator
    from referencing import Registry, Resource

    d = cdi_schema_dir()
    schema = jsonlib.loads((d / "schema.json").read_text())
    defs = jsonlib.loads((d / "defs.json").read_text())
    registry: Registry[Any] = Registry().with_resource(
        "defs.json", Resource.from_contents(defs, default_specification=referencing.jsonschema.DRAFT7)
    )
    problems = [
        f"schema: {e.message} at {list(e.absolute_path)}"
        for e in Draft7Validator(schema, registry=registry).iter_errors(doc)
    ]
    if not isinstance(doc, dict):
        return [*problems, "not an object"]
    for dev in doc.get("devices") or []:
        name = dev.get("name", "") if isinstance(dev, dict) else ""
        if not name or "/" in name:
            problems.append(f"device name {name!r} is empty or has a '/'")
    kind = doc.get("kind", "")
    if not isinstance(kind, str) or kind.count("/") != 1:
        problems.append(f"kind {kind!r} is not vendor/class (exactly one '/')")
    return problems


def read_cdi(path: Path) -> dict[str, Any] | None:
    """The parsed CDI file, or None if it is not there (or not yet complete)."""
    try:
        doc = jsonlib.loads(path.read_text())
    except (FileNotFoundError, jsonlib.JSONDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def cdi_env(doc: dict[str, Any]) -> dict[str, str]:
    """The spec-level containerEdits env as a dict."""
    env: dict[str, str] = {}
    for item in (doc.get("containerEdits") or {}).get("env") or []:
        key, _, value = str(item).partition("=")
        env[key] = value
    return env


# -- sampling an invariant in the background ------------------------------------------


@contextlib.contextmanager
def always(description: str, holds: Callable[[], bool], interval: float = 0.02) -> Iterator[list[float]]:
    """Sample `holds` every `interval` s on a thread while the block runs; fail if it ever did not hold.

    Yields the list of times (s since the start) at which it was seen not to hold.
    """
    misses: list[float] = []
    stop = threading.Event()
    start = time.monotonic()

    def sample() -> None:
        while True:
            if not holds():
                misses.append(time.monotonic() - start)
            if stop.wait(interval):
                return

    sampler = threading.Thread(target=sample, name=f"always: {description}", daemon=True)
    sampler.start()
    try:
        yield misses
    finally:
        stop.set()
        sampler.join(timeout=5)
    assert not misses, f"{description} did not hold at t={[round(t, 3) for t in misses[:10]]}s"


# -- common set-ups and checks ------------------------------------------------------


def bring_up(lab: Lab, nodes: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """Serve, then join and start each node (id → fake-hw profile); wait until all converge."""
    if not lab.running("serve"):
        lab.serve()
    for node_id, profile in nodes.items():
        lab.join(node_id)
        lab.node(node_id, profile)
    return {node_id: lab.wait_converged(node_id) for node_id in nodes}


def assert_no_tracebacks(lab: Lab) -> None:
    """No process logged a traceback (called before teardown, so shutdown is not judged here)."""
    bad = lab.logs_with("Traceback")
    assert not bad, (
        "tracebacks in "
        + ", ".join(bad)
        + ":\n"
        + "\n".join(
            f"----- {name}\n{text[max(0, text.index('Traceback') - 300) :][:3000]}" for name, text in bad.items()
        )
    )
