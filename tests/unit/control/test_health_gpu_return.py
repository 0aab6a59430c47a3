"""A person's GPU cordons against a real store (SQLite and PostgreSQL): `bc health gpu cordon|return`.

What is asserted is what an operator sees: the atoms placement offers, the cordons `bc health` lists, the
events with who and why, the one-line errors and their exit codes, and what the reconciler does next.
"""

from __future__ import annotations

import random

import pytest

from bc.control.base.bus import Bus
from bc.control.capacity.placement_wake import may_fit_more
from bc.control.health import admin as health_admin
from bc.control.health import gpus as health_gpus
from bc.control.signing.signer import NullSigner
from bc.errors import Conflict, NotFound, UsageError
from bc.jobs.engine import JobEngine
from bc.jobs.health import HealthReconciler
from bc.store import Store
from bc.store import events as events_sql
from tests.unit.control.conftest import AddNode
from tests.unit.control.test_health_loop import commands, episodes, events, free_gpus_on, settle, sick, well


@pytest.fixture
async def uuids(add_node: AddNode) -> list[str]:
    inv = await add_node("n1")
    await add_node("n2")
    return [g.uuid for g in inv.gpus]


@pytest.fixture
async def reconciler(store: Store, bus: Bus) -> tuple[HealthReconciler, JobEngine]:
    await health_admin.set_policy(store, bus, "{}", "admin", "the defaults")
    engine = JobEngine(store, bus, NullSigner(), random.Random(3), holder="w1")
    return HealthReconciler(store, bus, engine, random.Random(4), holder="w1"), engine


async def quarantine_first_gpu(store: Store, gpu: str, health: HealthReconciler, engine: JobEngine) -> None:
    """A reset that fails and a reboot that fails: the GPU is quarantined, for a person."""
    await sick(store, "n1", gpu)
    await health.pass_once()
    (reset,) = await commands(store, "gpu.reset")
    await settle(store, str(reset["id"]), {"gpus": [{"uuid": gpu, "reset": False, "healthy": False}]})
    await engine.pass_once()
    for c in await commands(store, "diag.nvml"):
        await settle(store, str(c["id"]), {})
    await engine.pass_once()
    await health.pass_once()
    (reboot,) = await commands(store, "node.reboot")
    await settle(store, str(reboot["id"]), None, state="failed")
    await engine.pass_once()
    await health.pass_once()
    assert [e["state"] for e in await episodes(store)] == ["quarantined"]


async def test_an_operator_returns_a_quarantined_gpu_with_who_and_why_and_placement_wakes(
    store: Store, bus: Bus, uuids: list[str], reconciler: tuple[HealthReconciler, JobEngine]
) -> None:
    health, engine = reconciler
    g = uuids[0]
    await quarantine_first_gpu(store, g, health, engine)
    assert await free_gpus_on(store, "n1") == 7
    await well(store, "n1")  # the person fixed it (a reset by hand, a new board)
    seq = await _seq(store)

    out = await health_gpus.return_gpu(store, bus, "n1", "0", "reseated the board", "alice")

    assert (out.gpu_uuid, out.cordon.quarantined, out.still_sick) == (g, True, "")
    assert await free_gpus_on(store, "n1") == 8
    (returned,) = [d for t, d in await events(store) if t == "health.gpu.returned" and d.get("operator")]
    assert returned == {
        "node": "n1",
        "gpu": g,
        "episode": returned["episode"],
        "was": "quarantined",
        "reason": "reseated the board",
        "operator": "alice",
    }
    async with store.transaction(write=False) as tx:
        (ev,) = await events_sql.of_types_since(tx, seq, ("health.gpu.returned",))
    assert may_fit_more(str(ev["type"]), str(ev["data"]))  # the placement loop passes again
    assert await health._has_work(seq)  # and so does the reconciler: a returned GPU may be acted on again


async def test_a_gpu_returned_while_still_sick_says_so_and_the_policy_acts_on_it_again(
    store: Store, bus: Bus, uuids: list[str], reconciler: tuple[HealthReconciler, JobEngine]
) -> None:
    health, engine = reconciler
    g = uuids[0]
    await quarantine_first_gpu(store, g, health, engine)
    out = await health_gpus.return_gpu(store, bus, "n1", g, "", "alice")
    assert out.still_sick == "Xid79"
    await health.pass_once()  # sick again within the repeat window of its last start: quarantined again
    assert [e["state"] for e in await episodes(store)] == ["quarantined", "quarantined"]
    assert len(await commands(store, "gpu.reset")) == 1


async def test_a_manual_cordon_keeps_new_holds_off_and_the_reconciler_leaves_it_to_a_person(
    store: Store, bus: Bus, uuids: list[str], reconciler: tuple[HealthReconciler, JobEngine]
) -> None:
    health, _ = reconciler
    g = uuids[2]
    out = await health_gpus.cordon_gpu(store, bus, "n1", "2", "fan noise, RMA ticket 41", "bob")
    assert (out.gpu_uuid, out.cordon.quarantined, out.cordon.episode_id) == (g, False, "")
    assert out.cordon.reason == "cordoned by bob: fan noise, RMA ticket 41"
    assert await free_gpus_on(store, "n1") == 7
    await sick(store, "n1", g)
    await health.pass_once()
    assert await episodes(store) == []  # kept out for a person: no episode, no job
    with pytest.raises(Conflict, match=f"GPU {g} of node n1 is already cordoned: cordoned by bob"):
        await health_gpus.cordon_gpu(store, bus, "n1", g, "again", "bob")
    await health_gpus.return_gpu(store, bus, "n1", g, "fan replaced", "bob")
    assert await free_gpus_on(store, "n1") == 8
    types = [(t, d.get("operator")) for t, d in await events(store) if t.startswith("health.gpu.")]
    assert types == [("health.gpu.cordoned", "bob"), ("health.gpu.returned", "bob")]


async def test_refusals_are_one_sentence_with_their_exit_codes(
    store: Store, bus: Bus, uuids: list[str], reconciler: tuple[HealthReconciler, JobEngine]
) -> None:
    health, _ = reconciler
    with pytest.raises(NotFound, match=r"^no node n9$") as nf:
        await health_gpus.return_gpu(store, bus, "n9", "0", "", "alice")
    assert nf.value.exit_code == 3
    with pytest.raises(NotFound, match="node n1 has no GPU 8 "):
        await health_gpus.return_gpu(store, bus, "n1", "8", "", "alice")
    with pytest.raises(NotFound, match="node n1 has no GPU GPU-nope "):
        await health_gpus.cordon_gpu(store, bus, "n1", "GPU-nope", "x", "alice")
    with pytest.raises(Conflict, match=f"^GPU {uuids[1]} of node n1 is not cordoned: nothing to return$") as c:
        await health_gpus.return_gpu(store, bus, "n1", "1", "", "alice")
    assert c.value.exit_code == 4
    with pytest.raises(UsageError, match="say why with --reason") as u:
        await health_gpus.cordon_gpu(store, bus, "n1", "1", "  ", "alice")
    assert u.value.exit_code == 2
    with pytest.raises(UsageError, match="control character"):
        await health_gpus.cordon_gpu(store, bus, "n1", "1", "a\x1b[2Jb", "alice")
    await sick(store, "n1", uuids[0])
    await health.pass_once()  # running: its episode returns it
    with pytest.raises(Conflict, match=r"is in remediation \(episode h-.*, running\): it returns when the episode"):
        await health_gpus.return_gpu(store, bus, "n1", "0", "", "alice")
    assert await free_gpus_on(store, "n1") == 7


def test_a_gpu_is_named_by_its_uuid_or_its_index() -> None:
    inv = {"gpus": [{"index": 0, "uuid": "GPU-a"}, {"index": 1, "uuid": "GPU-b"}]}
    assert health_gpus.resolve_gpu(inv, "1") == "GPU-b"
    assert health_gpus.resolve_gpu(inv, "GPU-a") == "GPU-a"
    assert health_gpus.resolve_gpu(inv, "2") is None
    assert health_gpus.resolve_gpu({}, "GPU-gone", ["GPU-gone"]) == "GPU-gone"  # fell off the bus, still cordoned
    assert health_gpus.resolve_gpu(inv, "GPU-c") is None


async def _seq(store: Store) -> int:
    async with store.transaction(write=False) as tx:
        return await events_sql.last_seq(tx)
