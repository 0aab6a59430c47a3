"""Self-update end to end with real PyInstaller binaries: signed releases, A/B slots, confirm or roll back.

The session builds the one-file binary three times (`build/dist.py binary --version-override`): 1.0.0, the
node's first install; 1.1.0, a new release; and 1.2.0 with `--test-never-dial`, a release whose agent never
reaches a gateway. `bc serve` (this checkout) keeps and serves the releases over HTTPS
(`--release-listen`), trusted through the bc CA. The node runs `<install>/current node --fake-hw …`; with no
systemd here, `Supervisor` restarts `current` whenever it exits, as `Restart=always` would.

One node goes through, in order:

1. a release with a bad signature: refused before anything is swapped (the disk is byte for byte the same);
2. a kill -9 right after each forward step of the swap (STAGE, PLACE, ARM, paused there by the test-only
   `BC_TEST_UPGRADE_PAUSE_AFTER`): the restarted node runs exactly one of its two binaries (its log says
   which version from which slot), 1.0.0 from slot a, and the command is FAILED `interrupted`;
3. 1.2.0, which never connects: rolled back within the (shortened, 8 s) deadline; 1.0.0 runs again and
   reports FAILED `update-failed`;
4. a kill -9 right after SWITCH to 1.1.0: the restart runs 1.1.0 from slot b, which confirms on its first
   Welcome (SUCCEEDED), through `bc release rollout`.

Set BC_SELF_UPDATE_DIST to a directory holding 1.0.0/, 1.1.0/ and 1.2.0/ from an earlier run to skip the builds.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import platform
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519

from agent.upgrade.slots import install, read_disk
from bc.pki import releases

from .harness import HEARTBEAT_S, REPO, Lab, free_port

pytestmark = pytest.mark.e2e

BUILD_TIMEOUT_S = 900
CONFIRM_S = 8
VERSIONS = {"1.0.0": [], "1.1.0": [], "1.2.0": ["--test-never-dial"]}
STARTED = re.compile(r"event=agent\.started node=\S+ version=(\S+) slot=(\S+)")


def binary_name(version: str) -> str:
    return f"bc-{version}-linux-{platform.machine()}"


@pytest.fixture(scope="session")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    prebuilt = os.environ.get("BC_SELF_UPDATE_DIST")
    root = Path(prebuilt) if prebuilt else tmp_path_factory.mktemp("self-update-dist")
    out: dict[str, Path] = {}
    for version, extra in VERSIONS.items():
        path = root / version / binary_name(version)
        if not path.exists():
            t0 = time.monotonic()
            argv = [sys.executable, str(REPO / "build" / "dist.py"), "binary", "--version-override", version, *extra]
            argv += ["--dist-dir", str(root / version), "--work-dir", str(root / f"work-{version}")]
            r = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
            assert r.returncode == 0, f"build of {version} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
            print(f"built {version} {' '.join(extra)} in {time.monotonic() - t0:.0f} s")
        out[version] = path
    return out


class Supervisor:
    """`Restart=always` for `current`: start it, and again whenever it exits, until `stop`."""

    def __init__(self, argv: list[str], env: Mapping[str, str], log: Path) -> None:
        self.argv, self.env, self.log = argv, dict(env), log
        self.next_env: dict[str, str] = {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self._stopping = False
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        self._started.wait(10)

    def _loop(self) -> None:
        while not self._stopping:
            env = {**self.env, **self.next_env}
            self.next_env = {}
            with self.log.open("ab") as out:
                out.write(f"--- supervisor: start {self.starts + 1}\n".encode())
                out.flush()
                self.proc = subprocess.Popen(
                    self.argv,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            self.starts += 1
            self._started.set()
            self.proc.wait()
            if not self._stopping:
                time.sleep(0.2)  # RestartSec=

    def kill9(self) -> None:
        """SIGKILL the whole process group (a one-file binary is a bootloader and its child)."""
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def restart_with(self, env: Mapping[str, str]) -> None:
        """Stop the running process; the next start gets `env` on top (once)."""
        self.next_env = dict(env)
        before = self.starts
        self.kill9()
        deadline = time.monotonic() + 20
        while self.starts == before and time.monotonic() < deadline:
            time.sleep(0.05)

    def stop(self) -> None:
        self._stopping = True
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill9()
        self._thread.join(15)


@dataclass
class Fleet:
    lab: Lab
    sup: Supervisor
    install: Path
    log: Path

    def starts(self) -> list[tuple[str, str]]:
        return STARTED.findall(self.log.read_text(errors="replace"))

    def wait_started(self, count: int, timeout: float = 60) -> tuple[str, str]:
        """The (version, slot) of start number `count` (1-based) of the agent, once it has logged it."""
        found = self.lab.wait_for(f"start {count} of the node", lambda: len(self.starts()) >= count, timeout)
        assert found
        return self.starts()[count - 1]

    def upgrade_status(self, after: str = "") -> dict[str, Any] | None:
        nodes = self.lab.bc("release", "status")["nodes"]
        return next((n for n in nodes if n["command_id"] and n["command_id"] != after), None)

    def settled(self, after: str, timeout: float = 90) -> dict[str, Any]:
        def done() -> dict[str, Any] | None:
            n = self.upgrade_status(after)
            return n if n and n["state"] in ("succeeded", "failed", "rejected", "expired", "cancelled") else None

        return self.lab.wait_for("the daemon.upgrade to settle", done, timeout)

    def logged(self, needle: str, timeout: float = 60) -> None:
        self.lab.wait_for(needle, lambda: needle in self.log.read_text(errors="replace"), timeout)


@pytest.fixture
def fleet(builds: dict[str, Path], tmp_path: Path) -> Iterator[Fleet]:
    lab = Lab(tmp_path)
    release_port = free_port()
    lab.spawn(
        "serve",
        "serve",
        "--data-dir",
        str(lab.server_dir),
        "--listen",
        lab.address,
        "--heartbeat-interval",
        str(HEARTBEAT_S),
        "--release-listen",
        f"127.0.0.1:{release_port}",
        port=lab.port,
        env={"BC_DATA_DIR": str(lab.server_dir)},
    )
    key = tmp_path / "release.key"
    lab.bc("release", "key", "add", "--key", str(key), "--generate")
    for version in ("1.1.0", "1.2.0"):
        info = lab.bc("release", "publish", str(builds[version]), "--key", str(key))
        assert info["version"] == version and info["url"].startswith(f"https://127.0.0.1:{release_port}/"), info
    lab.join("n1")
    inst = tmp_path / "opt-bc"
    install(inst, builds["1.0.0"], version="1.0.0")
    log = tmp_path / "node-n1.log"
    argv = [str(inst / "current"), "node", "--data-dir", str(lab.node_dir("n1")), "--fake-hw", "hgx-h100-8"]
    argv += ["--heartbeat-interval", str(HEARTBEAT_S), "--upgrade-confirm", str(CONFIRM_S)]
    env = {"HOME": str(lab.home), "TMPDIR": str(tmp_path), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    sup = Supervisor(argv, env, log)
    f = Fleet(lab, sup, inst, log)
    try:
        yield f
    finally:
        sup.stop()
        lab.close()
        print(lab.dump_logs())
        print(log.read_text(errors="replace")[-6000:])


def rollout(f: Fleet, version: str) -> None:
    f.lab.bc("release", "rollout", version, "--nodes", "n1", "--no-wait")


def disk_bytes(inst: Path) -> dict[str, bytes]:
    return {p.name: (os.readlink(p).encode() if p.is_symlink() else p.read_bytes()) for p in sorted(inst.iterdir())}


@pytest.mark.timeout(BUILD_TIMEOUT_S + 600)
def test_self_update_with_binaries(fleet: Fleet, builds: dict[str, Path]) -> None:
    f, lab = fleet, fleet.lab
    assert f.wait_started(1) == ("1.0.0", "a")
    lab.wait_converged("n1", timeout=60)

    # 1. A bad signature: refused before anything is swapped.
    status = lab.bc("release", "status")
    good = next(r for r in status["releases"] if r["version"] == "1.1.0")
    sha, size = good["sha256"], int(good["size"])
    signed = releases.Release("bc", "1.1.0", int(good["sequence"]), good["platform"], sha, size)
    forged = releases.sign(ed25519.Ed25519PrivateKey.generate(), signed)
    payload = {"version": "1.1.0", "url": good["url"], "sha256": sha, "size": size, "sequence": good["sequence"]}
    payload |= {"name": "bc", "platform": good["platform"]}
    payload["signature"] = base64.b64encode(forged).decode()
    before = disk_bytes(f.install)
    r = lab.run("cmd", "run", "n1", "daemon.upgrade", "--payload", json.dumps(payload), "--wait", "--json", timeout=60)
    assert r.returncode == 8, r  # the command failed, as `bc cmd run --wait` says with its exit status
    cmd = json.loads(r.stdout)
    assert (cmd["state"], cmd["reason"]) == ("failed", "bad-release"), cmd
    assert "does not verify under any trusted release key" in cmd["message"], cmd
    assert disk_bytes(f.install) == before
    last = cmd["id"]

    # 2. kill -9 after STAGE, PLACE, ARM: the old binary runs again and the command is interrupted.
    n_starts = 1
    for step in ("stage", "place", "arm"):
        f.sup.restart_with({"BC_TEST_UPGRADE_PAUSE_AFTER": step})
        n_starts += 1
        assert f.wait_started(n_starts) == ("1.0.0", "a")
        lab.wait_converged("n1", timeout=60)
        rollout(f, "1.1.0")
        f.logged(f"event=upgrade.paused step={step}")
        f.sup.kill9()
        n_starts += 1
        assert f.wait_started(n_starts) == ("1.0.0", "a"), step
        done = f.settled(last)
        assert (done["state"], done["reason"]) == ("failed", "interrupted"), (step, done)
        last = done["command_id"]
        assert os.readlink(f.install / "current") == "bc.a"

    # 3. 1.2.0 never connects: rolled back at the deadline, and 1.0.0 reports update-failed.
    lab.wait_converged("n1", timeout=60)
    t0 = time.monotonic()
    rollout(f, "1.2.0")
    assert f.wait_started(n_starts + 1) == ("1.2.0", "b")  # re-exec'd into the new slot
    assert f.wait_started(n_starts + 2, timeout=CONFIRM_S + 60) == ("1.0.0", "a")  # and back
    n_starts += 2
    done = f.settled(last)
    assert (done["state"], done["reason"]) == ("failed", "update-failed"), done
    assert time.monotonic() - t0 < CONFIRM_S + 60
    last = done["command_id"]
    record = read_disk(f.install).record
    assert record.state == "failed" and "1.2.0" in record.failed_versions

    # 4. kill -9 right after SWITCH to 1.1.0: the restart runs 1.1.0 from slot b, which confirms.
    f.sup.restart_with({"BC_TEST_UPGRADE_PAUSE_AFTER": "switch"})
    n_starts += 1
    assert f.wait_started(n_starts) == ("1.0.0", "a")
    lab.wait_converged("n1", timeout=60)
    rollout(f, "1.1.0")
    f.logged("event=upgrade.paused step=switch")
    f.sup.kill9()
    n_starts += 1
    assert f.wait_started(n_starts) == ("1.1.0", "b")
    done = f.settled(last)
    assert (done["state"], done["version"]) == ("succeeded", "1.1.0"), done
    record = read_disk(f.install).record
    assert (record.state, record.floor, os.readlink(f.install / "current")) == ("confirmed", 1, "bc.b")
    lab.wait_converged("n1", timeout=60)
