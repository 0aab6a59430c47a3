"""`bc join --reset --yes`: the old identity and journal move aside (never deleted) and the node joins again.

The CLI runs in a thread (it starts its own event loop) against the in-process lab's real server.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

from click.testing import CliRunner, Result

from agent.doctor import run_node_checks
from agent.identity import Identity
from bc.cli.main import cli
from bc.seams.clock import SystemClock
from tests.integration.conftest import InprocLab

MOVED = ["identity.json", "node.key", "node.crt", "ca.crt", "journal.db"]


async def bc(*args: str) -> Result:
    return await asyncio.to_thread(CliRunner().invoke, cli, list(args))


def digests(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in d.iterdir() if p.is_file()}


async def joined_and_ran(lab: InprocLab, node_id: str) -> Path:
    """A node that joined, connected once and stopped: identity and journal on disk."""
    await lab.join(node_id)
    await lab.start_node(node_id)
    await lab.wait_connected(node_id)
    await lab.stop_node(node_id)
    return lab.node_dir(node_id)


async def test_reset_moves_identity_and_journal_aside_and_joins_again(lab: InprocLab) -> None:
    d = await joined_and_ran(lab, "n1")
    before = digests(d)
    old = Identity.load(d)
    token = (await lab.admin.create_token("n1")).token

    r = await bc("join", "--server", lab.server.address, "--token", token, "--data-dir", str(d), "--reset", "--yes")

    assert r.exit_code == 0, r.output
    assert r.output.splitlines()[-1] == f"joined as n1; identity stored in {d}"
    aside = {p.name: p for p in d.iterdir() if ".reset-" in p.name}
    stamps = {name.split(".reset-")[1] for name in aside}
    assert len(stamps) == 1  # one reset, one suffix: a UTC timestamp
    [stamp] = stamps
    assert len(stamp) == 16 and stamp.endswith("Z") and stamp[8] == "T"
    for name in MOVED:
        assert digests(d)[f"{name}.reset-{stamp}"] == before[name], f"{name} was not moved aside intact"
    assert r.output.splitlines()[0].startswith("moved aside: identity.json.reset-")

    new = Identity.load(d)
    assert new.node_id == "n1" and new.identity_generation == old.identity_generation + 1
    assert (d / "node.crt").read_bytes() != (d / f"node.crt.reset-{stamp}").read_bytes()

    seq = (await lab.wait_connected("n1")).seq
    await lab.start_node("n1")  # a new journal: the old one is aside, so nothing refuses it
    await lab.wait_connected("n1", after_seq=seq)
    await lab.stop_node("n1")
    found = {f.name: f.status for f in run_node_checks(d, SystemClock().now())}
    assert found["identity"] == found["certificate"] == found["journal"] == found["server"] == "pass"


async def test_reset_without_yes_refuses_and_says_what_it_would_move(lab: InprocLab) -> None:
    d = await joined_and_ran(lab, "n1")
    before = digests(d)
    token = (await lab.admin.create_token("n1")).token

    r = await bc("join", "--server", lab.server.address, "--token", token, "--data-dir", str(d), "--reset")

    assert r.exit_code == 2
    assert r.output == (
        f"error: --reset would move aside in {d}: identity.json, node.key, node.crt, ca.crt, journal.db"
        + ("".join(f", journal.db{s}" for s in ("-wal", "-shm") if f"journal.db{s}" in before))
        + " (renamed .reset-<time>, not deleted); stop bc node first, then add --yes\n"
    )
    assert digests(d) == before


async def test_join_without_reset_keeps_refusing_a_dir_with_an_identity(lab: InprocLab) -> None:
    d = await joined_and_ran(lab, "n1")
    before = digests(d)
    token = (await lab.admin.create_token("n1")).token

    r = await bc("join", "--server", lab.server.address, "--token", token, "--data-dir", str(d))

    assert r.exit_code == 2
    assert r.output == f"error: {d} already holds the identity of node n1; use another --data-dir\n"
    assert digests(d) == before


async def test_a_reset_against_the_wrong_server_leaves_the_identity_in_place(lab: InprocLab) -> None:
    d = await joined_and_ran(lab, "n1")
    before = digests(d)
    token = (await lab.admin.create_token("n1")).token
    nowhere = "127.0.0.1:1"

    r = await bc("join", "--server", nowhere, "--token", token, "--data-dir", str(d), "--reset", "--yes", "--json")

    assert r.exit_code == 5
    assert "cannot reach the server at 127.0.0.1:1" in r.output
    assert digests(d) == before


async def test_reset_json_lists_the_moved_files(lab: InprocLab) -> None:
    d = await joined_and_ran(lab, "n1")
    token = (await lab.admin.create_token("n1")).token

    r = await bc(
        "join", "--server", lab.server.address, "--token", token, "--data-dir", str(d), "--reset", "--yes", "--json"
    )

    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    moved = [Path(p).name.split(".reset-")[0] for p in doc["moved_aside"]]
    assert moved[:5] == MOVED
    assert all(Path(p).exists() for p in doc["moved_aside"])


def test_two_resets_in_one_second_never_rename_over_each_other(tmp_path: Path) -> None:
    from agent.join import reset_identity

    (tmp_path / "node.key").write_text("first")
    (tmp_path / "node.key.next").write_text("pending")  # a renewal cut short: it goes aside too
    first = reset_identity(tmp_path, 1_800_000_000.0)
    (tmp_path / "node.key").write_text("second")
    second = reset_identity(tmp_path, 1_800_000_000.0)

    assert [p.name for p in first] == ["node.key.reset-20270115T080000Z", "node.key.next.reset-20270115T080000Z"]
    assert [p.name for p in second] == ["node.key.reset-20270115T080000Z-2"]
    assert [p.read_text() for p in (*first, *second)] == ["first", "pending", "second"]
    assert reset_identity(tmp_path, 1_800_000_001.0) == []  # nothing left to move
