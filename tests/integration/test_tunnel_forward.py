"""`bc port-forward` carrying 100 MiB each way, whole (docs/access.md; the figure is bench.tunnel's).

The real CLI as a subprocess, a real `bc serve` and a real agent in process: the bytes cross TLS to the node's
certificate, the gateway's bounded relay and the node's own connection, and come back; every byte is checked by
its SHA-256 (upload) and its count (download), and the tunnel's record counts them.
"""

from __future__ import annotations

from pathlib import Path

from bench.tunnel import run


async def test_port_forward_carries_100_mib_each_way(tmp_path: Path) -> None:
    f = await run(100, tmp_path)
    assert f["bytes_up_recorded"] >= 100 * 1024 * 1024 and f["bytes_down_recorded"] >= 100 * 1024 * 1024
    assert f["open_relays_after"] == 0
    assert f["upload_mib_s"] > 0 and f["download_mib_s"] > 0
