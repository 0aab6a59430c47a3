"""Attack: local files the CLI reads that never end or are huge. `@/dev/zero` read forever, a FIFO blocked
the CLI until someone wrote to it, and a 3 GB config (a sparse file costs nothing to make) was read whole
into memory. Every such file (`@file` payloads and sections, the operator config and the PEM files it
names, keys) must now be a regular file of at most `max_local_file` bytes: anything else is exit 2 at
once, naming the file. The real `bc` runs as a subprocess with its address space capped, so a CLI that
read without bound fails fast here instead of taking the machine's memory."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.e2e.harness import bc_executable
from tests.security.badinput_helpers import memory_capped, one_sentence_problems

BUDGET_S = 20.0
"""Far more than a refusal takes (well under a second); a CLI blocked on a FIFO hits it."""


def run_bc(tmp: Path, *args: str, config: Path | None = None) -> subprocess.CompletedProcess[str]:
    home = tmp / "home"
    home.mkdir(exist_ok=True)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "BC_DATA_DIR": str(tmp / "data"),
        "BC_CONFIG": str(config or tmp / "no-config.json"),
    }
    return subprocess.run(
        memory_capped([bc_executable(), *args]),
        capture_output=True,
        text=True,
        env=env,
        timeout=BUDGET_S,
        stdin=subprocess.DEVNULL,
    )


def sparse(path: Path, size: int) -> Path:
    with path.open("wb") as f:
        f.truncate(size)
    return path


def fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def test_a_3_gb_sparse_operator_config_is_exit_2_at_once(tmp_path: Path) -> None:
    config = sparse(tmp_path / "config.json", 3 << 30)
    r = run_bc(tmp_path, "nodes", config=config)
    assert one_sentence_problems(r, 2, str(config), "max_local_file") == []


@pytest.mark.parametrize("pem", ["/dev/zero", "fifo", "sparse"])
def test_a_config_naming_a_pem_that_never_ends_is_exit_2(tmp_path: Path, pem: str) -> None:
    target = {"/dev/zero": Path("/dev/zero"), "fifo": tmp_path / "key.fifo", "sparse": tmp_path / "key.pem"}[pem]
    if pem == "fifo":
        fifo(target)
    elif pem == "sparse":
        sparse(target, 3 << 30)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"server": "127.0.0.1:1", "ca": str(target), "cert": "c.pem", "key": "k.pem"}))
    r = run_bc(tmp_path, "nodes", config=config)
    assert one_sentence_problems(r, 2, str(target)) == []


@pytest.mark.parametrize("source", ["/dev/zero", "fifo", "sparse", "directory"])
def test_an_at_file_that_never_ends_is_exit_2_at_once(tmp_path: Path, source: str) -> None:
    path = {
        "/dev/zero": lambda: Path("/dev/zero"),
        "fifo": lambda: fifo(tmp_path / "section.fifo"),
        "sparse": lambda: sparse(tmp_path / "section.json", 3 << 30),
        "directory": lambda: tmp_path,
    }[source]()
    for args in (("spec", "set", "n1", "host", f"@{path}"), ("cmd", "run", "n1", "diag.nvml", "--payload", f"@{path}")):
        r = run_bc(tmp_path, *args)
        assert one_sentence_problems(r, 2, str(path)) == [], args
