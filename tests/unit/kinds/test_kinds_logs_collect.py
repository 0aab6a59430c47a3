"""logs.collect into the data dir: the tarball holds the existing log files and the journal summary."""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
from pathlib import Path
from typing import Any

from agent.kinds import REGISTRY
from agent.kinds.logs_collect import KEEP_TARBALLS, TOO_LARGE, redact_url
from bc.protocol.pb import kinds_pb2
from bc.testing import virtual_clock
from tests.unit.kinds.kind_helpers import FakeNode, pack

LOGS = REGISTRY["logs.collect"]


def members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path, "r:gz") as tar:
        out: dict[str, bytes] = {}
        for m in tar.getmembers():
            f = tar.extractfile(m)
            if f is not None:
                out[m.name] = f.read()
        return out


async def test_logs_are_kept_in_the_data_dir(node: FakeNode, tmp_path: Path) -> None:
    (tmp_path / "var" / "log").mkdir(parents=True)
    agent_log = tmp_path / "var" / "log" / "agent.log"
    agent_log.write_text("event=agent.started\n")
    other = tmp_path / "other" / "agent.log"
    other.parent.mkdir()
    other.write_text("second file, same name\n")
    missing = tmp_path / "var" / "log" / "gone.log"

    async def summary() -> dict[str, Any]:
        return {"commands": 3, "applied_generation": 7}

    node.ctx.log_paths = [agent_log, missing, other]
    node.ctx.journal_summary = summary
    res = await LOGS.run(node.ctx, LOGS.parse(pack(kinds_pb2.LogsCollectRequest())))

    assert res.ok, res
    path = Path(res.result["path"])
    assert path.parent == node.data_dir / "logs" and path.name.startswith("logs-") and path.name.endswith(".tar.gz")
    data = path.read_bytes()
    assert res.result["bytes"] == len(data)
    assert res.result["sha256"] == hashlib.sha256(data).hexdigest()
    assert res.result["files"] == [str(agent_log), str(other)]
    assert res.result["missing"] == [str(missing)]
    got = members(path)
    assert got[str(agent_log).lstrip("/")] == b"event=agent.started\n"
    assert got[str(other).lstrip("/")] == b"second file, same name\n"
    assert json.loads(got["journal-summary.json"]) == {"applied_generation": 7, "commands": 3}
    assert [p.name for p in (node.data_dir / "logs").iterdir()] == [path.name]  # no partial file left
    json.dumps(res.result)


async def test_without_a_summary_or_logs_the_tarball_is_empty(node: FakeNode) -> None:
    res = await LOGS.run(node.ctx, kinds_pb2.LogsCollectRequest())
    assert res.ok and res.result["files"] == [] and members(Path(res.result["path"])) == {}


async def test_over_the_cap_is_too_large_and_leaves_nothing(node: FakeNode, tmp_path: Path) -> None:
    big = tmp_path / "big.log"
    big.write_bytes(os.urandom(256 * 1024))  # random bytes do not compress
    node.ctx.log_paths = [big]
    res = await LOGS.run(node.ctx, kinds_pb2.LogsCollectRequest(max_bytes=64 * 1024))
    assert (res.ok, res.reason) == (False, TOO_LARGE)
    assert res.result == {"max_bytes": 64 * 1024}
    assert list((node.data_dir / "logs").iterdir()) == []


async def test_collections_in_the_same_second_do_not_collide_and_old_ones_are_pruned(node: FakeNode) -> None:
    stale = node.data_dir / "logs" / ".logs-20200101T000000.000000Z.tar.gz.partial"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"left by a crash")
    paths = []
    for _ in range(KEEP_TARBALLS + 2):
        res = await LOGS.run(node.ctx, kinds_pb2.LogsCollectRequest())
        assert res.ok
        paths.append(res.result["path"])
    assert len(set(paths)) == len(paths)
    kept = sorted(str(p) for p in (node.data_dir / "logs").glob("logs-*.tar.gz"))
    assert kept == paths[-KEEP_TARBALLS:]  # the newest ones, in name order = age order
    assert not stale.exists()


def test_a_signed_upload_url_is_shown_without_its_secret() -> None:
    url = "https://user:pw@bucket.example.com:8443/logs/n1.tar.gz?X-Amz-Signature=abc#frag"
    assert redact_url(url) == "https://bucket.example.com:8443/logs/n1.tar.gz"


async def test_the_tarball_is_stamped_with_the_agents_clock(node: FakeNode) -> None:
    """Its name and the summary's mtime come from the agent's clock, not the host's; a clock that stands
    still still names each collection anew, in age order."""

    async def summary() -> dict[str, Any]:
        return {}

    node.ctx.clock = virtual_clock(1_234_567_890.5)  # 2009-02-13 23:31:30.5 UTC
    node.ctx.journal_summary = summary
    first = await LOGS.run(node.ctx, kinds_pb2.LogsCollectRequest())
    second = await LOGS.run(node.ctx, kinds_pb2.LogsCollectRequest())
    names = [Path(r.result["path"]).name for r in (first, second)]
    assert names == ["logs-20090213T233130.500000Z.tar.gz", "logs-20090213T233130.500001Z.tar.gz"]
    with tarfile.open(first.result["path"], "r:gz") as tar:
        assert tar.getmember("journal-summary.json").mtime == 1_234_567_890
