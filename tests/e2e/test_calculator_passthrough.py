"""After the documented install, `bc` first on PATH still answers the shell scripts that want the calculator.

docs/install.md installs the artifact as `/usr/local/bin/bc`, ahead of the system's `/usr/bin/bc`. This
test builds the zipapp (`build/dist.py zipapp`, what `make zipapp` runs), installs it the documented way
(`install -m 0755 bc.pyz /usr/local/bin/bc`) into a scratch root, puts that bin first on PATH, and runs
what scripts run through `sh`: `echo '1+1' | bc` prints 2, `bc -l` has the math library, a file argument
is read, while `bc --help` and every subcommand stay ours. With no calculator on PATH it says so and exits
127; two copies of ours on one PATH do not hand the call to each other in a loop. Needs the OS's `bc`
package (`.ci/run` installs it).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .harness import REPO

pytestmark = pytest.mark.e2e

SYSTEM_BC = "/usr/bin/bc"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The scratch root's `usr/local/bin`, holding the zipapp installed as `bc` the way docs/install.md does."""
    assert os.access(SYSTEM_BC, os.X_OK), "the OS's bc package is not installed (apt-get install bc)"
    d = tmp_path_factory.mktemp("calc-dist")
    work = tmp_path_factory.mktemp("calc-work")
    built = subprocess.run(
        [sys.executable, str(REPO / "build" / "dist.py"), "zipapp", "--dist-dir", str(d), "--work-dir", str(work)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    # What the README and docs/install.md point to instead of quoting sizes: the build prints its figures.
    assert re.search(r"^built \S*bc\.pyz: [\d.]+ MiB in \d+ s; `--version` starts in ", built.stdout, re.M), (
        built.stdout
    )
    root = tmp_path_factory.mktemp("root")
    bin_dir = root / "usr" / "local" / "bin"
    bin_dir.mkdir(parents=True)
    subprocess.run(["install", "-m", "0755", str(d / "bc.pyz"), str(bin_dir / "bc")], check=True)
    return bin_dir


def sh(script: str, path: str, home: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    home.mkdir(parents=True, exist_ok=True)
    env = {"PATH": path, "HOME": str(home), "TMPDIR": str(home), "LANG": "C.UTF-8"}
    return subprocess.run(
        ["/bin/sh", "-c", script],
        input=stdin,
        stdin=None if stdin is not None else subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=env,
        cwd=home,
        timeout=120,
    )


def test_calculator_calls_reach_the_calculator_and_ours_stay_ours(installed: Path, tmp_path: Path) -> None:
    path = f"{installed}:/usr/bin:/bin"
    home = tmp_path / "home"
    assert sh("command -v bc", path, home).stdout.strip() == str(installed / "bc")

    two = sh("echo '1+1' | bc", path, home)
    assert (two.returncode, two.stdout, two.stderr) == (0, "2\n", "")
    sine = sh("echo 's(1)' | bc -l", path, home)
    assert sine.returncode == 0 and sine.stdout.startswith(".8414709848"), sine
    assert sh("echo 'scale=3; 1/8' | bc -lq", path, home).stdout == ".125\n"
    (home / "sum.bc").write_text("6*7\nquit\n")
    assert sh("bc sum.bc", path, home).stdout == "42\n"
    assert sh("bc -q sum.bc", path, home).stdout == "42\n"
    assert sh("bc", path, home, stdin="2^10\n").stdout == "1024\n"

    ours = sh("bc nodes --help", path, home)
    assert ours.returncode == 0 and ours.stdout.startswith("Usage: bc nodes"), ours
    helped = sh("bc --help", path, home)
    assert helped.returncode == 0 and "an operations toolkit for GPU fleets" in helped.stdout, helped
    version = sh("bc --version", path, home)
    assert version.returncode == 0 and version.stdout.startswith("bc "), version
    typo = sh("bc nodez", path, home)
    assert typo.returncode == 2 and "nodez" in typo.stderr, typo


def test_no_calculator_installed_is_said_and_never_loops(installed: Path, tmp_path: Path) -> None:
    # PATH with our bc and nothing else named bc (sh, echo and python3 from a bin of their own).
    tools = tmp_path / "tools"
    tools.mkdir()
    for name in ("sh", "echo", "python3", "env"):
        found = shutil.which(name, path="/usr/bin:/bin")
        assert found, name
        (tools / name).symlink_to(found)
    second = tmp_path / "second-copy"
    second.mkdir()
    shutil.copy2(installed / "bc", second / "bc")  # two copies of ours, as after an install in two places

    for path in (f"{installed}:{tools}", f"{installed}:{second}:{tools}", f"{second}:{installed}:{tools}"):
        r = sh("echo '1+1' | bc", path, tmp_path / "home")
        assert r.returncode == 127, (path, r)
        assert r.stdout == ""
        assert r.stderr.startswith(
            "bc: `bc (reading stdin)` is a call to the POSIX calculator, and none is installed"
        ), r
        assert "apt-get install bc" in r.stderr
        flag = sh("bc -l </dev/null", path, tmp_path / "home")
        assert flag.returncode == 127 and "`bc -l` is a call to the POSIX calculator" in flag.stderr, flag
