"""`bench.session_mem`'s reading of the traced gateway's reports (`bench.serve_traced`) and of /proc."""

from __future__ import annotations

import os
import tracemalloc

from bench.serve_traced import mallinfo, report
from bench.session_mem import smaps_anon_kib, threads_of, traced_kib


def test_a_report_without_tracemalloc_reads_as_nothing_traced_and_says_what_malloc_holds() -> None:
    text = report(None, None)
    assert traced_kib(text) == 0.0
    assert "malloc in_use" in text  # glibc's mallinfo2: what the C side holds too


def test_a_traced_report_carries_its_total_and_the_growth_since_the_first() -> None:
    tracemalloc.start(4)
    try:
        base = tracemalloc.take_snapshot()
        held = [bytearray(1024) for _ in range(64)]  # 64 KiB made between the two snapshots
        snap = tracemalloc.take_snapshot()
        text = report(snap, base)
    finally:
        tracemalloc.stop()
    assert traced_kib(text) >= 64
    assert "growth since snapshot 0" in text and len(held) == 64


def test_this_process_has_anonymous_memory_and_threads() -> None:
    assert smaps_anon_kib(os.getpid()) > 0
    assert threads_of(os.getpid()) >= 1
    assert mallinfo().startswith("malloc")
