"""A private network namespace for a test: a `unshare -n` child that sleeps, and a `nft` wrapper that runs in
it (`nsenter -t PID -n nft …`), so real nft loads and lists real tables without touching the host's."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


class NetNs:
    def __init__(self, pid: int, nft: Path) -> None:
        self.pid = pid
        self.nft = nft
        """A script that runs nft in the namespace (InstanceNetwork's nft_binary)."""

    def run(self, *argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run a command in the namespace; a non-zero exit fails the test with its stderr."""
        done = subprocess.run(
            ["nsenter", "-t", str(self.pid), "-n", *argv], input=stdin, capture_output=True, text=True, timeout=30
        )
        assert done.returncode == 0, f"{' '.join(argv)}: {done.stderr}"
        return done


@contextmanager
def private_netns(tmp: Path) -> Iterator[NetNs]:
    for tool in ("unshare", "nsenter", "nft"):
        if shutil.which(tool) is None:
            pytest.fail(f"needs {tool} (util-linux, nftables)")
    # The child says "ready" from inside the new namespace, then becomes `sleep`: reading that line waits
    # on the event itself.
    holder = subprocess.Popen(
        ["unshare", "-n", "sh", "-c", "echo ready; exec sleep infinity"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready", "unshare -n failed"
        nft = tmp / "nft-in-ns"
        nft.write_text(f'#!/bin/sh\nexec nsenter -t {holder.pid} -n nft "$@"\n')
        nft.chmod(0o755)
        yield NetNs(holder.pid, nft)
    finally:
        holder.kill()
        holder.wait()
