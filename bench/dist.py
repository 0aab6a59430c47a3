"""The shipped artifacts' figures, all from one run: build time, size, and how fast each starts.

1. build: `build/dist.py zipapp` and `build/dist.py binary`, each timed as a whole
   (staging, wheel, pip, shiv / PyInstaller).
2. `bc --version`: the binary, the zipapp (`python3 bc.pyz`) and the virtualenv's
   `bc`, in a fresh HOME and TMPDIR. "first" is the first run there (the zipapp
   unpacks itself into HOME; the one-file binary unpacks into TMPDIR on every run);
   "then" is the median of the next runs.
3. `bc node` to its first Hello: from spawning `bc node --fake-hw hgx-h100-8` (a
   node already joined) to `event=session.welcomed` in its log, against one `bc serve`
   from the virtualenv; the node is stopped with SIGTERM between runs.

Usage: python -m bench.dist [--runs 5] [--no-build]   (or python -m bench.run --only dist)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DIST = REPO / "dist"
VERSION = str(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def clean_env(root: Path) -> dict[str, str]:
    """A fresh HOME and TMPDIR and nothing of ours on PATH: what a new host has."""
    (root / "home").mkdir(parents=True, exist_ok=True)
    (root / "tmp").mkdir(parents=True, exist_ok=True)
    return {"HOME": str(root / "home"), "TMPDIR": str(root / "tmp"), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}


def flavours() -> dict[str, list[str]]:
    """How to run `bc` as each artifact: the argv prefix."""
    return {
        "binary": [str(DIST / f"bc-{VERSION}-linux-{platform.machine()}")],
        "zipapp": [zipapp_python(), str(DIST / "bc.pyz")],
        "venv": [str(REPO / ".venv" / "bin" / "bc")],
    }


def zipapp_python() -> str:
    ours = "{}.{}".format(*sys.version_info[:2])
    probe = subprocess.run(
        ["/usr/bin/python3", "-c", "import sys; print('{}.{}'.format(*sys.version_info[:2]))"],
        capture_output=True,
        text=True,
    )
    return "/usr/bin/python3" if probe.stdout.strip() == ours else getattr(sys, "_base_executable", sys.executable)


def summary(samples: Sequence[float]) -> dict[str, float]:
    return {"first_s": round(samples[0], 3), "then_median_s": round(statistics.median(samples[1:]), 3)}


def build() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for what in ("zipapp", "binary"):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, str(REPO / "build" / "dist.py"), what], check=True, capture_output=True)
        out[f"{what}_build_s"] = round(time.perf_counter() - t0, 1)
    return out


def sizes() -> dict[str, float]:
    files = {name: Path(argv[-1]) for name, argv in flavours().items() if name != "venv"}
    return {name: round(path.stat().st_size / 2**20, 1) for name, path in files.items()}


def version_start(runs: int) -> dict[str, dict[str, float]]:
    figures = {}
    for name, prefix in flavours().items():
        with tempfile.TemporaryDirectory(prefix=f"bc-bench-dist-{name}-") as tmp:
            env = clean_env(Path(tmp))
            samples = []
            for _ in range(runs + 1):
                t0 = time.perf_counter()
                subprocess.run([*prefix, "--version"], env=env, check=True, capture_output=True)
                samples.append(time.perf_counter() - t0)
        figures[name] = summary(samples)
    return figures


def wait(description: str, predicate: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {description}")
        time.sleep(0.005)


def stop(proc: subprocess.Popen[bytes], grace_s: float = 30.0) -> bool:
    """SIGTERM to the process group, SIGKILL after `grace_s`; whether it stopped in time."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
        return True
    except subprocess.TimeoutExpired:
        print(f"warning: {proc.args!r} ignored SIGTERM for {grace_s:.0f} s", file=sys.stderr)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return False


def welcomed(log: Path) -> bool:
    return b"event=session.welcomed" in log.read_bytes()


def node_to_hello(runs: int) -> dict[str, dict[str, float]]:
    root = Path(tempfile.mkdtemp(prefix="bc-bench-dist-"))
    venv_bc = flavours()["venv"][0]
    port = free_port()
    address = f"127.0.0.1:{port}"
    server_env = {**clean_env(root / "server-env"), "BC_DATA_DIR": str(root / "server")}
    serve_log = open(root / "serve.log", "ab")  # noqa: SIM115 (closed in finally)
    serve = subprocess.Popen(
        [venv_bc, "serve", "--data-dir", str(root / "server"), "--listen", address],
        stdout=serve_log,
        stderr=subprocess.STDOUT,
        env=server_env,
        start_new_session=True,
    )
    figures: dict[str, dict[str, float]] = {}
    try:
        wait("bc serve's operator config", (root / "server" / "operator" / "config.json").exists)
        for name, prefix in flavours().items():
            env = clean_env(root / f"env-{name}")
            node_dir = root / f"node-{name}"
            node_env = clean_env(root / f"env-{name}-node")  # fresh: the zipapp's first start unpacks it
            token = subprocess.run(
                [venv_bc, "token", "create", "--node-id", f"bench-{name}", "--json"],
                env=server_env,
                check=True,
                capture_output=True,
                text=True,
            )
            secret = json.loads(token.stdout)["token"]
            subprocess.run(
                [*prefix, "join", "--server", address, "--token", secret, "--data-dir", str(node_dir)],
                env=env,
                check=True,
                capture_output=True,
            )
            samples: list[float] = []
            stops_late = 0
            for i in range(runs + 1):
                log = root / f"node-{name}-{i}.log"
                with open(log, "wb") as out:
                    t0 = time.perf_counter()
                    node = subprocess.Popen(
                        [*prefix, "node", "--data-dir", str(node_dir), "--fake-hw", "hgx-h100-8"],
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        env=node_env,
                        start_new_session=True,
                    )
                    try:
                        wait(f"{name} node's Welcome", partial(welcomed, log))
                        samples.append(time.perf_counter() - t0)
                    finally:
                        if not stop(node):
                            stops_late += 1
                            print(log.read_text(errors="replace")[-3000:], file=sys.stderr)
            figures[name] = {**summary(samples), "stops_late": stops_late}
    finally:
        os.killpg(serve.pid, signal.SIGTERM)
        serve.wait(timeout=30)
        serve_log.close()
        shutil.rmtree(root, ignore_errors=True)
    return figures


def dist_figures(runs: int = 5, build_first: bool = True) -> dict[str, Any]:
    doc: dict[str, Any] = build() if build_first else {}
    doc["size_mib"] = sizes()
    doc["version_start"] = version_start(runs)
    doc["node_to_welcome"] = node_to_hello(runs)
    return doc


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5, help="Runs after the first, per figure.")
    ap.add_argument("--no-build", action="store_true", help="Measure what is in dist/ now.")
    args = ap.parse_args()
    print("dist:", json.dumps(dist_figures(args.runs, not args.no_build)), flush=True)


if __name__ == "__main__":
    main()
