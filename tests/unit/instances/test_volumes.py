"""Persistent volumes: the pure rules (space promised, one writer) and the store on a real tmp filesystem."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from agent.instances.volume_rules import MIB, OpenVolumes, Space, promise_refusal, reserve
from agent.instances.volumes import VolumeStore
from agent.offload import to_thread
from bc.protocol.pb import spec_pb2


def test_the_reserve_is_five_percent_and_at_least_the_minimum() -> None:
    assert reserve(100 << 30) == 5 << 30
    assert reserve(10 << 30) == 2 << 30
    assert reserve(10 << 30, min_reserve=0) == (10 << 30) // 20


def test_a_promise_beyond_free_less_reserve_less_unwritten_is_refused_with_the_reference_message() -> None:
    space = Space(
        total=100 * 1024 * MIB,
        available=10 * 1024 * MIB,
        reserved=5 * 1024 * MIB,
        committed=0,
        outstanding=3 * 1024 * MIB,
    )
    assert promise_refusal("data", 2 * 1024 * MIB, space) is None
    assert promise_refusal("data", 3 * 1024 * MIB + 1, space) == (
        "volume data: 3073 MiB needed, 2048 MiB can still be promised to volumes on this host"
        " (10240 MiB free, 5120 MiB reserved, 3072 MiB promised to volumes' unwritten space)"
    )


@given(st.lists(st.tuples(st.sampled_from("abc"), st.sampled_from("xy"), st.booleans()), max_size=20))
def test_never_two_writers_nor_a_writer_beside_readers(opens: list[tuple[str, str, bool]]) -> None:
    ledger = OpenVolumes()
    for inst, vol, ro in opens:
        if ledger.refusal(inst, vol, ro) is None:
            ledger.open(inst, vol, ro)
        for v, held in ledger.holders.items():
            writers = [i for i, r in held.items() if not r]
            assert len(writers) <= 1 and (not writers or len(held) == 1), (v, held)


def test_the_first_keeps_it_and_a_release_lets_the_next_in() -> None:
    ledger = OpenVolumes()
    ledger.open("a", "x", False)
    assert ledger.refusal("b", "x", True) == "volume x is open read-write in instance a: one writer at a time"
    ledger.close("a")
    ledger.open("b", "x", True)
    assert ledger.refusal("c", "x", True) is None
    assert ledger.refusal("c", "x", False) == "volume x is open read-only in instance b: no writer beside readers"
    assert ledger.of("b") == ["x"] and ledger.ids() == {"x"}


def vol(vid: str, size: int, serial: str = "s1") -> spec_pb2.Volume:
    return spec_pb2.Volume(id=vid, serial=serial, size_bytes=size)


async def test_volumes_are_created_sparse_grown_never_shrunk_and_destroyed_when_unlisted(tmp_path: Path) -> None:
    store = VolumeStore(tmp_path / "volumes", to_thread, min_reserve=0)
    assert await store.sync([vol("a", 1 << 30)]) == {}
    st = os.stat(store.path("a"))
    assert (st.st_size, st.st_mode & 0o777, st.st_blocks) == (1 << 30, 0o600, 0)  # sparse: nothing taken yet
    assert (tmp_path / "volumes" / "a.json").read_text() == '{"id": "a", "serial": "s1", "size_bytes": 1073741824}'
    assert os.stat(tmp_path / "volumes").st_mode & 0o777 == 0o700
    with open(store.path("a"), "r+b") as f:
        f.write(b"x" * 4096)
        os.fsync(f.fileno())
    assert await store.sync([vol("a", 2 << 30)]) == {}
    assert os.stat(store.path("a")).st_size == 2 << 30
    assert store.path("a").open("rb").read(4) == b"xxxx"  # grown by truncation: the data stays
    problems = await store.sync([vol("a", 1 << 30)])
    assert problems == {"a": "volume a is 2147483648 bytes and the spec says 1073741824: a volume is never shrunk"}
    storage = await store.storage()
    assert storage.committed_bytes == 2 << 30 and 0 < storage.outstanding_bytes < 2 << 30
    assert storage.reserved_bytes == storage.total_bytes * 5 // 100
    assert await store.destroy_unlisted(set(), {"a"}) == []  # open in a domain: kept
    assert await store.destroy_unlisted(set(), set()) == ["a"]
    assert sorted(p.name for p in (tmp_path / "volumes").iterdir()) == []


async def test_a_volume_beyond_the_reserve_is_refused_and_keeps_its_size(tmp_path: Path) -> None:
    store = VolumeStore(tmp_path / "volumes", to_thread, min_reserve=0)
    free = (await store.storage()).available_bytes
    problems = await store.sync([vol("big", (free // 512 + 1) * 512)])
    assert (
        problems["big"].startswith("volume big: ")
        and "MiB can still be promised to volumes on this host" in problems["big"]
    )
    assert not store.path("big").exists()
    assert await store.sync([vol("small", 1 << 20)]) == {}
    # a sparse volume's unwritten space counts as promised: a second one as large as what is left is refused
    left = await store.storage()
    can = left.available_bytes - left.reserved_bytes - left.outstanding_bytes
    problems = await store.sync([vol("small", 1 << 20), vol("two", (can // 512 + 2048) * 512, "s2")])
    assert list(problems) == ["two"]
