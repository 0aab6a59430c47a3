"""The README's runnable examples still run: every fenced block right after a `<!-- runnable: … -->` line
is run, as written, by `sh -e` against a demo lab (`bc serve` and the demo's three fake nodes, `bc.cli.demo.NODES`)
from this test's tmp dir, with our `bc` first on PATH as after an install.

A block that stops working (a renamed command or option, an output the next line relies on, an exit code)
fails here with the block's trace (`sh -x`). The README says which blocks are runnable; the rest are
reference syntax (`[--node n1]`, `ID`) or need a host (systemd, PostgreSQL).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from bc.cli.demo import NODES

from .harness import REPO, Lab, assert_no_tracebacks, bring_up

MARKER = re.compile(r"^<!-- runnable: .* -->$")


def runnable_blocks(text: str) -> list[tuple[int, str]]:
    """(line number, body) of each fenced block that directly follows a runnable marker."""
    lines = text.splitlines()
    out: list[tuple[int, str]] = []
    for i, line in enumerate(lines):
        if not MARKER.match(line):
            continue
        fence = lines[i + 1] if i + 1 < len(lines) else ""
        assert fence.startswith("```"), f"README.md:{i + 1}: a runnable marker must sit right above a fenced block"
        end = next(j for j in range(i + 2, len(lines)) if lines[j].startswith("```"))
        out.append((i + 3, "\n".join(lines[i + 2 : end]) + "\n"))
    return out


def test_the_readme_marks_its_runnable_blocks() -> None:
    blocks = runnable_blocks((REPO / "README.md").read_text())
    assert len(blocks) >= 2, "the README's runnable markers are gone"
    assert all("bc " in body for _, body in blocks)


ARTIFACT_FIGURE = re.compile(r"(binary|zipapp)[^\n|]*\d+(\.\d+)? MiB|\d+(\.\d+)? MiB[^\n|]*(binary|zipapp)", re.I)


@pytest.mark.parametrize("page", ["README.md", "docs/install.md"])
def test_no_page_states_the_artifacts_sizes(page: str) -> None:
    """Sizes change with every dependency: `make binary` / `make zipapp` print them; the pages point there."""
    text = (REPO / page).read_text()
    assert not [m.group(0) for m in ARTIFACT_FIGURE.finditer(text)]
    assert "`make binary` and `make zipapp` print" in text


@pytest.mark.e2e
def test_the_readmes_runnable_blocks_run_against_a_demo_lab(lab: Lab, tmp_path: Path) -> None:
    bring_up(lab, dict(NODES))
    work = tmp_path / "readme"
    work.mkdir()
    bin_dir = Path(lab.bc_path).parent  # our `bc` first on PATH; the system's calculator after it
    env = {**lab.env, "PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHONPATH": ""}
    for line, body in runnable_blocks((REPO / "README.md").read_text()):
        r = subprocess.run(
            ["/bin/sh", "-e", "-x", "-c", body],
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert r.returncode == 0, (
            f"README.md:{line}: the block exited {r.returncode}\n--- stdout\n{r.stdout[-3000:]}\n"
            f"--- stderr (sh -x)\n{r.stderr[-3000:]}"
        )
        if "echo '1+1' | bc" in body:
            assert "\n2\n" in f"\n{r.stdout}", r.stdout  # the calculator answered, not our help
        if "--node n2 --tenant acme" in body:  # the README's word on a cordoned --node: pending, not exit 4
            assert "node n2 is cordoned" in r.stdout, r.stdout
    assert_no_tracebacks(lab)
