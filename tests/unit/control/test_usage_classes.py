"""Usage by class: the store's per-class sums equal the pure rule's, on both stores, and a MIG
reservation's use is cut by profile to the millisecond (the parts add up to the whole)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bc.control.capacity.usage_classes import ClassPart, ClassRow, add_windows, class_rows, split_by_profile
from bc.control.capacity.usage_windows import BY, aggregate
from bc.control.capacity.views import window_of
from bc.store import Store
from bc.store import capacity as cap_sql

RANGES = [(None, None), (3_600_000, 40_000_000), (10_000_001, 10_000_002)]
CLASSES = ["gpu", "gpu.mig", "gpu.slot"]


@pytest.mark.parametrize(("since", "until"), RANGES)
async def test_the_store_sums_each_class_apart_as_the_pure_rule_does(
    store: Store, since: int | None, until: int | None
) -> None:
    rng = random.Random(5)
    async with store.transaction() as tx:
        for i in range(30):
            device_class = CLASSES[i % 3]
            await tx.execute(
                "INSERT INTO reservations (id, seq, allocation_id, device_class, gpus, state, created_at_ms)"
                " VALUES (:id, :seq, :a, :c, 1, 'pending', 0)",
                {"id": f"r{i}", "seq": i + 1, "a": f"a{i}", "c": device_class},
            )
            t = rng.randrange(0, 20) * 3_600_000
            for _ in range(rng.randrange(1, 8)):
                length = rng.choice([3_600_000, 1_234_567, 1])
                await cap_sql.insert_usage_window(
                    tx,
                    reservation_id=f"r{i}",
                    start_ms=t,
                    end_ms=t + length,
                    node_id=f"n{i % 4}",
                    tenant=f"t{i % 2}",
                    device_class=device_class,
                    atoms=rng.choice([1, 2, 7]),
                )
                t += length
        windows = [window_of(r) for r in await cap_sql.usage_windows(tx, None, None)]
        for by in BY:
            stored = {
                ClassPart(str(r["key"]), str(r["device_class"]), str(r["mig_reservation"])): (
                    int(r["atom_ms"]),
                    int(r["windows"]),
                )
                for r in await cap_sql.usage_sums_by_class(tx, since, until, by)
            }
            pure: dict[ClassPart, tuple[int, int]] = {}
            add_windows(pure, windows, since, until, by)
            assert stored == pure, by
            # Per class, the classes together are what the class-blind sum had.
            blind = {u.key: u.atom_ms for u in aggregate(windows, since, until, by)}
            rows = class_rows(pure, {})
            assert {k: sum(r.atom_ms for r in rows if r.key == k) for k in blind} == blind, by
            assert all(r.device_class != "gpu.mig" or r.profile == "" for r in rows)


def test_a_mig_reservation_is_cut_by_the_profile_of_each_instance() -> None:
    sums = {
        ClassPart("acme", "gpu.mig", "r1"): (3 * 1000 + 2, 2),
        ClassPart("acme", "gpu.mig", "r2"): (500, 1),
        ClassPart("acme", "gpu", ""): (7000, 3),
        ClassPart("acme", "gpu.slot", ""): (4000, 1),
    }
    profiles = {"r1": ["3g.40gb", "1g.10gb", "1g.10gb"], "r2": ["1g.10gb"]}
    assert class_rows(sums, profiles) == [
        ClassRow("acme", "gpu", "", 7000, 3),
        ClassRow("acme", "gpu.mig", "1g.10gb", 2001 + 1 + 500, 3),  # 2/3 of r1 and its remainder, all of r2
        ClassRow("acme", "gpu.mig", "3g.40gb", 1000, 2),
        ClassRow("acme", "gpu.slot", "", 4000, 1),
    ]


@given(st.integers(min_value=0, max_value=10**15), st.lists(st.sampled_from(["1g.10gb", "2g.20gb", ""]), max_size=7))
def test_the_profile_parts_add_up_to_the_whole(atom_ms: int, profiles: list[str]) -> None:
    parts = split_by_profile(atom_ms, profiles)
    assert sum(ms for _, ms in parts) == atom_ms
    assert len({p for p, _ in parts}) == len(parts)
    if profiles:
        assert {p for p, _ in parts} == set(profiles)
