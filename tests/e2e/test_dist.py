"""The shipped artifacts, end to end: `make zipapp` and `make binary` run a fleet with no virtualenv.

The session builds both artifacts once (`build/dist.py all`, what the Makefile
targets run, into a temp dir), then each artifact runs the operator's whole path in a clean
environment — a temp HOME, PATH=/usr/bin:/bin, no PYTHONPATH, no virtualenv,
the current directory outside the checkout: `bc serve`, `bc token create`,
`bc join`, `bc node --fake-hw`, a reservation converging to a CDI spec, a
command succeeding, and `bc doctor` on the node's data dir.

The binary runs as itself. The zipapp runs as an operator would run it on a
host without a virtualenv: `python3 bc.pyz` with the system's CPython when it
is this minor version (the zipapp's compiled dependencies are built for it),
else this virtualenv's base interpreter in isolated mode (`-I`).
"""

from __future__ import annotations

import glob
import hashlib
import platform
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .harness import REPO, Lab, assert_no_tracebacks, cdi_problems, read_cdi

pytestmark = pytest.mark.e2e

#: Building both artifacts takes well under a minute on the 2-core CI machine; the bound is for a cold pip cache.
BUILD_TIMEOUT_S = 600
VERSION = str(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"])


@dataclass(frozen=True)
class Dist:
    binary: Path
    zipapp: Path
    sums: Path
    build_s: float


@pytest.fixture(scope="session")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    # Into a temp dir: a test run must not replace what `make binary` left in dist/, nor race another run.
    d = tmp_path_factory.mktemp("dist")
    work = tmp_path_factory.mktemp("dist-work")
    t0 = time.monotonic()
    result = subprocess.run(
        [sys.executable, str(REPO / "build" / "dist.py"), "all", "--dist-dir", str(d), "--work-dir", str(work)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
    )
    build_s = time.monotonic() - t0
    output = result.stdout[-3000:] + "\n" + result.stderr[-3000:]
    assert result.returncode == 0, f"build/dist.py all exited {result.returncode}:\n{output}"
    # The build's own figures (size, start-up), shown with `pytest -s` and in a failing test's output.
    print("\n".join(line for line in result.stdout.splitlines() if line.startswith(("built ", "bc "))))
    print(f"build/dist.py all took {build_s:.0f} s")
    return Dist(d / f"bc-{VERSION}-linux-{platform.machine()}", d / "bc.pyz", d / "SHA256SUMS", build_s)


def python_for_zipapp() -> list[str]:
    """`python3` of the host if it is our minor version, else our base interpreter, isolated."""
    system = "/usr/bin/python3"
    probe = subprocess.run(
        [system, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True, text=True
    )
    if probe.returncode == 0 and probe.stdout.strip() == "{}.{}".format(*sys.version_info[:2]):
        return [system]
    return [getattr(sys, "_base_executable", sys.executable), "-I"]


def clean_env(root: Path, server_dir: Path) -> dict[str, str]:
    """What a fresh login on an air-gapped host has: no virtualenv, no PYTHONPATH, nothing of ours on PATH."""
    home = root / "home"
    tmp = root / "tmp"
    home.mkdir(parents=True, exist_ok=True)
    tmp.mkdir(parents=True, exist_ok=True)
    return {
        "HOME": str(home),
        "TMPDIR": str(tmp),
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "BC_DATA_DIR": str(server_dir),
    }


@pytest.fixture(params=["binary", "zipapp"])
def artifact_lab(
    request: pytest.FixtureRequest, dist: Dist, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, Lab]]:
    """A lab whose every `bc` is the built artifact; yields (artifact, lab)."""
    artifact = str(request.param)
    lab = Lab(tmp_path)
    if artifact == "binary":
        lab.bc_path = str(dist.binary)
    else:
        # The lab runs `bc ARGS`: a two-line launcher makes that `python3 bc.pyz ARGS`, same pid (exec).
        launcher = tmp_path / "launcher" / "bc"
        launcher.parent.mkdir()
        launcher.write_text("#!/bin/sh\nexec " + " ".join([*python_for_zipapp(), str(dist.zipapp)]) + ' "$@"\n')
        launcher.chmod(0o755)
        lab.bc_path = str(launcher)
    lab.env = clean_env(tmp_path, lab.server_dir)
    # Run from outside the checkout, so nothing can be imported from it by accident.
    monkeypatch.chdir(tmp_path)
    try:
        yield artifact, lab
    finally:
        lab.close()
        print(lab.dump_logs())


def version_fields(text: str) -> dict[str, str]:
    fields = {}
    for line in text.splitlines()[1:]:
        key, sep, value = line.partition(":")
        assert sep, f"`bc --version` line without a `key: value` form: {line!r}"
        fields[key.strip()] = value.strip()
    return fields


@pytest.mark.timeout(BUILD_TIMEOUT_S + 180)
def test_artifact_runs_a_fleet(artifact_lab: tuple[str, Lab]) -> None:
    artifact, lab = artifact_lab

    r = lab.run("--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == f"bc {VERSION}", r.stdout
    fields = version_fields(r.stdout)
    assert fields["built"].endswith(f"({artifact})") and not fields["built"].startswith("unknown"), fields
    assert fields["commit"] != "unknown", fields
    assert fields["python"].startswith("{}.{}.".format(*sys.version_info[:2])), fields
    for lib in ("grpcio", "cryptography"):
        assert fields[lib][:1].isdigit(), f"{lib}: {fields[lib]!r}"
    assert "textual" in fields, fields

    lab.serve()
    token = lab.bc("token", "create", "--node-id", "n1")["token"]
    joined = lab.bc("join", "--server", lab.address, "--token", token, "--data-dir", str(lab.node_dir("n1")))
    assert joined["node_id"] == "n1", joined
    lab.node("n1", "hgx-h100-8")
    lab.wait_converged("n1", timeout=30)

    res = lab.bc("reserve", "--gpus", "2", "--node", "n1")
    assert len(res["devices"]) == 2, res
    generation = lab.show("n1")["generation"]
    lab.wait_converged("n1", generation)
    cdi = lab.cdi_path("n1", res["allocation_id"])
    doc = lab.wait_for(f"the CDI spec {cdi.name}", lambda: read_cdi(cdi))
    assert cdi_problems(doc) == [], doc  # the schema came from the artifact's own data files
    lab.wait_reservation_state(res["id"], "active")

    cmd = lab.bc("cmd", "run", "n1", "inventory.refresh", "--wait", timeout=60)
    assert cmd["state"] == "succeeded", cmd

    # `bc doctor` is another issue's command: it must be in the artifact, and pass on a healthy node.
    assert "doctor" in lab.run("--help").stdout, "bc doctor is not registered in this build"
    r = lab.run("doctor", "--data-dir", str(lab.node_dir("n1")))
    assert r.returncode == 0, f"bc doctor exited {r.returncode}:\n{r.stdout}\n{r.stderr}"

    tui_opens_and_quits(lab)

    unit = lab.run("unit", "print", "node")
    assert unit.returncode == 0 and "ExecStart=/usr/local/bin/bc node " in unit.stdout, unit
    assert_no_tracebacks(lab)


def tui_opens_and_quits(lab: Lab) -> None:
    """`bc tui` in a real terminal (tmux): the fleet shows n1, `q` quits with status 0."""
    if shutil.which("tmux") is None:
        pytest.fail("tmux is needed for the bc tui smoke (apt-get install tmux)")
    sock, status = str(lab.root / "tmux.sock"), lab.root / "tui.status"
    env = " ".join(f"{k}={v}" for k, v in {**lab.env, "TERM": "xterm-256color"}.items())
    cmd = f"env -i {env} {lab.bc_path} tui; echo $? > {status}; sleep 30"
    tmux = ["tmux", "-S", sock]
    subprocess.run([*tmux, "new-session", "-d", "-s", "tui", "-x", "120", "-y", "40", cmd], check=True)
    try:
        shown = lab.wait_for(
            "bc tui showing n1",
            lambda: (
                (s := subprocess.run([*tmux, "capture-pane", "-p", "-t", "tui"], capture_output=True, text=True))
                and "n1" in s.stdout
                and "CONNECTIVITY" in s.stdout
            ),
        )
        assert shown
        subprocess.run([*tmux, "send-keys", "-t", "tui", "q"], check=True)
        lab.wait_for("bc tui to exit", lambda: status.exists() and status.read_text().strip() != "")
        assert status.read_text().strip() == "0"
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)


@pytest.mark.timeout(BUILD_TIMEOUT_S + 60)
def test_sha256sums_cover_both_artifacts(dist: Dist) -> None:
    listed = {}
    for line in dist.sums.read_text().splitlines():
        digest, sep, name = line.partition("  ")
        assert sep and len(digest) == 64, f"not a sha256sum line: {line!r}"
        listed[name] = digest
    for path in (dist.binary, dist.zipapp):
        assert path.name in listed, f"{path.name} missing from {dist.sums}: {sorted(listed)}"
        assert hashlib.sha256(path.read_bytes()).hexdigest() == listed[path.name], f"{path.name} changed"
    check = subprocess.run(
        ["sha256sum", "--check", "--strict", dist.sums.name], cwd=dist.sums.parent, capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr


def other_python_minor() -> str | None:
    """A CPython on this host whose minor version is not ours, if there is one (on PATH, or pyenv's)."""
    ours = "{}.{}".format(*sys.version_info[:2])
    candidates = [shutil.which(f"python3.{minor}") for minor in range(8, 16)]
    candidates += sorted(glob.glob(str(Path.home() / ".pyenv" / "versions" / "3.*" / "bin" / "python3")))
    for path in filter(None, candidates):
        probe = subprocess.run(
            [path, "-c", "import sys; print('{}.{}'.format(*sys.version_info[:2]))"], capture_output=True, text=True
        )
        if probe.returncode == 0 and probe.stdout.strip() not in ("", ours):
            return path
    return None


@pytest.mark.timeout(BUILD_TIMEOUT_S + 60)
def test_zipapp_refuses_another_python_in_one_line(dist: Dist, tmp_path: Path) -> None:
    other = other_python_minor()
    if other is None:
        pytest.skip("no CPython of another minor version on this host to try the zipapp with")
    r = subprocess.run(
        [other, str(dist.zipapp), "--version"],
        env=clean_env(tmp_path, tmp_path / "server"),
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2, r
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: bc.pyz needs CPython"), r.stderr
