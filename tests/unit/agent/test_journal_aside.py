"""Corrupt journals are moved aside and only the newest three copies are kept, so they cannot fill the disk."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from agent.journal import Journal
from agent.journal_aside import KEEP_CORRUPT, to_prune

NODE = "n1"

stamps = st.sets(st.integers(min_value=0, max_value=10**13), max_size=12)
sides = st.lists(st.sampled_from(["", "-wal", "-shm"]), min_size=1, max_size=3, unique=True)
foreign = st.sampled_from(
    ["journal.db", "journal.db-wal", "other.db.corrupt-5", "journal.db.corrupt-", "journal.db.corrupt-5.txt"]
)


@given(stamps, sides, st.lists(foreign, max_size=5), st.integers(min_value=0, max_value=5))
def test_the_newest_copies_stay_and_nothing_else_is_chosen(
    ms: set[int], suffixes: list[str], others: list[str], keep: int
) -> None:
    copies = {t: [f"journal.db.corrupt-{t}{s}" for s in suffixes] for t in ms}
    names = [n for group in copies.values() for n in group] + others
    pruned = set(to_prune(names, "journal.db", keep))
    newest = sorted(ms, reverse=True)[:keep]
    assert pruned == {n for t, group in copies.items() if t not in newest for n in group}
    assert not pruned & set(others)


def test_a_copy_goes_with_its_side_files() -> None:
    names = ["journal.db.corrupt-1", "journal.db.corrupt-1-wal", "journal.db.corrupt-2", "journal.db.corrupt-10"]
    # By the time in the name, not by text: 10 is newer than 2.
    assert to_prune(names, "journal.db", keep=2) == ["journal.db.corrupt-1", "journal.db.corrupt-1-wal"]


async def test_opening_a_corrupt_journal_keeps_the_newest_three_copies(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    old = [1_000, 2_000, 3_000, 4_000]
    for t in old:
        (tmp_path / f"journal.db.corrupt-{t}").write_bytes(b"an older corrupt journal")
        (tmp_path / f"journal.db.corrupt-{t}-wal").write_bytes(b"its wal")
    (tmp_path / "notes.txt").write_text("the operator's own file\n")
    path.write_bytes(b"not a sqlite database \x00\xff" * 100)

    j = await Journal.open(path, NODE)
    await j.close()

    left = sorted(p.name for p in tmp_path.iterdir() if ".corrupt-" in p.name)
    stamps_left = [n.removeprefix("journal.db.corrupt-") for n in left]
    just_moved = [f"journal.db.corrupt-{t}" for t in stamps_left if t.isdigit() and int(t) > 4_000]
    assert len(just_moved) == 1, left
    assert left == sorted(
        [
            just_moved[0],
            "journal.db.corrupt-3000",
            "journal.db.corrupt-3000-wal",
            "journal.db.corrupt-4000",
            "journal.db.corrupt-4000-wal",
        ]
    )
    assert len({n.split("-wal")[0] for n in left}) == KEEP_CORRUPT
    assert (tmp_path / "notes.txt").exists() and path.exists()
