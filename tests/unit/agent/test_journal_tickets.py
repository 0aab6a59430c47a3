"""The node's set of used exec tickets (agent.journal_tickets), and both journals applying it."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent import journal_tickets as rules
from agent.journal import Journal
from agent.memory_journal import MemoryJournal

jtis = st.text(alphabet="abcdef0123456789", min_size=1, max_size=4)
used_sets = st.dictionaries(jtis, st.integers(min_value=0, max_value=2_000), max_size=30)


@given(used=used_sets, jti=jtis, exp=st.integers(1, 3_000), now=st.integers(0, 2_000), cap=st.integers(1, 40))
def test_admit_refuses_every_live_replay_never_forgets_a_live_id_and_respects_the_cap(
    used: dict[str, int], jti: str, exp: int, now: int, cap: int
) -> None:
    v = rules.admit(used, jti, exp, now, cap)
    live = {j for j, e in used.items() if e > now}
    assert set(v.forget) == set(used) - live  # only the expired are forgotten
    if jti in used:
        assert v.refused == rules.REPLAYED
    elif len(live) >= cap:
        assert v.refused == rules.FULL
    else:
        assert v.refused == ""


def test_a_full_set_says_so() -> None:
    used = {f"j{i}": 100 for i in range(3)}
    v = rules.admit(used, "new", 100, 50, cap=3)
    assert v.refused == rules.FULL and "3 unexpired tickets" in rules.message(v.refused, 3)
    assert rules.admit(used, "new", 200, 100, cap=3).refused == ""  # they expired: room again


@pytest.fixture(params=["memory", "sqlite"])
async def journal(request: pytest.FixtureRequest, tmp_path: Path):  # type: ignore[no-untyped-def]
    if request.param == "memory":
        yield MemoryJournal()
        return
    j = await Journal.open(tmp_path / "journal.db", "n1")
    yield j
    await j.close()


async def test_both_journals_use_a_ticket_once_and_remember_it_until_it_expires(journal, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    assert await journal.use_ticket("a", 1_000, 0) == ""
    assert await journal.use_ticket("a", 1_000, 10) == rules.REPLAYED
    assert await journal.use_ticket("b", 2_000, 10) == ""
    # After a's expiry its id may go; b is still remembered.
    assert await journal.use_ticket("c", 3_000, 1_500) == ""
    assert await journal.use_ticket("b", 2_000, 1_600) == rules.REPLAYED


async def test_the_file_journal_remembers_used_tickets_across_a_restart(tmp_path: Path) -> None:
    j = await Journal.open(tmp_path / "journal.db", "n1")
    assert await j.use_ticket("a", 10_000, 0) == ""
    await j.close()
    j = await Journal.open(tmp_path / "journal.db", "n1")
    try:
        assert await j.use_ticket("a", 10_000, 5) == rules.REPLAYED
    finally:
        await j.close()
