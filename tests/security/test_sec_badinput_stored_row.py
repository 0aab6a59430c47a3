"""Attack: a pending reservation row with extreme values in the store (written by an older server, a
script or by hand) used to make every placement pass raise (OverflowError booking `start + duration`), so
no reservation could be placed fleet-wide. Now the pass sets such a row aside (failed, `set-aside: …`,
with a `reservation.set-aside` event naming it) and places the rest of the queue. Hypothesis drives the
real pass over a real store with extreme values in every numeric column."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from bc.control.capacity.placement_pass import PlacementPass
from bc.control.capacity.reservations import ReserveRequest, reserve
from bc.store import StoreError
from bc.testing import virtual_clock
from tests.security.badinput_helpers import (
    SIGNER,
    events_of,
    fleet_store,
    reservation_row,
    rng,
    store_pending_row,
)

INT64_MAX = 2**63 - 1
DAY_MS = 86_400_000
EXTREMES = st.sampled_from([-(2**63), -1, 0, 1, 2**31, 2**53, 2**62, INT64_MAX - 1, INT64_MAX])


async def placed_next_to(tmp: Path, rid: str, **values: object) -> tuple[str, str, list[str]] | None:
    """Store a row with `values`, reserve one GPU normally, run a pass: the row's state and reason, the
    normal reservation's state, and the subjects of `reservation.set-aside` events. None: the store's own
    CHECK constraints refuse such a row, so no pass can ever meet it."""
    async with fleet_store(tmp / "bc.db", virtual_clock()) as (store, bus):
        start_in = values.pop("start_in_ms", None)  # a window that starts that long after the store's now
        if isinstance(start_in, int):
            values["start_ms"] = await store.now_ms() + start_in
        try:
            await store_pending_row(store, rid, **values)
        except StoreError:
            return None
        normal = await reserve(store, bus, SIGNER, ReserveRequest(gpus=1), rng())
        await PlacementPass(store, bus, SIGNER, rng(), holder="w").pass_once()
        row = await reservation_row(store, rid)
        after = await reservation_row(store, str(normal["id"]))
        aside = [subject for subject, _ in await events_of(store, "reservation.set-aside")]
        return f"{row['state']}", f"{row['reason'] or ''}", [str(after["state"]), *aside]


def run(coro: object) -> object:
    from bc.seams.virtual_time import run as run_virtual

    return run_virtual(coro)  # type: ignore[arg-type]


def test_the_huge_duration_row_is_set_aside_and_the_rest_is_placed(tmp_path: Path) -> None:
    # `--duration 106751991167d` starting in an hour: its end does not fit an int64.
    state, reason, (normal, *aside) = run(  # type: ignore[misc]
        placed_next_to(tmp_path, "res-huge", start_in_ms=3_600_000, duration_ms=106751991167 * DAY_MS)
    )
    assert normal == "placed", "one bad row still stops the fleet's placement"
    assert (state, aside) == ("failed", ["res-huge"])
    assert reason.startswith("set-aside: duration_ms 9,223,372,036,828,800,000 is outside"), reason


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    column=st.sampled_from(["start_ms", "end_ms", "duration_ms", "gpus", "cpus", "memory_bytes", "hugepages_1g"]),
    value=EXTREMES,
    with_start=st.booleans(),
)
def test_any_extreme_value_in_a_stored_row_never_stops_the_pass(
    tmp_path_factory: pytest.TempPathFactory, column: str, value: int, with_start: bool
) -> None:
    values: dict[str, object] = {column: value}
    if with_start and column != "start_ms":
        values["start_ms"] = 60_000
    got = run(placed_next_to(tmp_path_factory.mktemp("row"), "res-x", **values))
    assume(got is not None)
    state, reason, (normal, *aside) = got  # type: ignore[misc]
    assert normal == "placed", f"{values}: the normal reservation is {normal}"
    if aside:
        assert (state, aside) == ("failed", ["res-x"]) and reason.startswith("set-aside: "), (values, reason)
    else:  # in bounds after all (e.g. 0 CPUs): planned like any other row
        assert not reason.startswith("set-aside"), (values, reason)
