"""`bc serve` under tracemalloc, for `bench.session_mem --traced`: who owns a gateway's per-session memory.

    python -m bench.serve_traced DUMP_DIR serve --data-dir ... --listen ...

Runs the `bc` CLI as the console script does (`bc.cli.entry.main`), with tracemalloc started first
(`BENCH_TRACE_FRAMES` frames a traceback, 16 by default) and SIGUSR2 taken: each signal writes
`DUMP_DIR/snapshot-K.txt` (K = 0, 1, ...): the traced total, the top allocations by line and by
traceback, and, from the second on, the growth since snapshot 0 by traceback (the harness signals once
before any session and once per step). A bench module, not the product: `bc serve` itself never starts
tracemalloc, which costs its own memory and CPU on every allocation. The report is written in the signal
handler, between two bytecodes of the event loop's thread: the loop stalls for the seconds a snapshot
takes, which the harness allows for (it waits for the file, then for the sessions to settle).
"""

from __future__ import annotations

import ctypes
import linecache
import os
import signal
import sys
import tracemalloc
from pathlib import Path
from types import FrameType

TOP = 40
"""Rows of each table in a report."""
_EXCLUDE = (
    tracemalloc.Filter(False, tracemalloc.__file__),
    tracemalloc.Filter(False, linecache.__file__),
    tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
    tracemalloc.Filter(False, "<frozen importlib._bootstrap_external>"),
)


def _kib(n: int) -> str:
    return f"{n / 1024:10.1f} KiB"


class MallInfo2(ctypes.Structure):
    """glibc's `struct mallinfo2` (malloc.h): what malloc holds, C and Python alike (pymalloc's arenas are mmaps
    of 1 MiB, counted in `hblkhd` beside other large blocks)."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def mallinfo() -> str:
    """One line of glibc's malloc figures: in use (`uordblks`), free in its heaps (`fordblks`), mmapped (`hblkhd`)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = MallInfo2
        m = libc.mallinfo2()
    except (OSError, AttributeError):
        return "mallinfo2 unavailable"
    return (
        f"malloc in_use {_kib(m.uordblks)} free_in_heaps {_kib(m.fordblks)} heaps {_kib(m.arena)} "
        f"mmapped {_kib(m.hblkhd)} ({m.hblks} blocks)"
    )


def report(snap: tracemalloc.Snapshot | None, base: tracemalloc.Snapshot | None) -> str:
    """The text of one snapshot: total, top lines, top tracebacks, and the growth since `base` by traceback."""
    if snap is None:
        return f"traced {_kib(0)} (tracemalloc off)\n{mallinfo()}\n"
    traced, peak = tracemalloc.get_traced_memory()
    out = [f"traced {_kib(traced)} peak {_kib(peak)} tracemalloc_overhead {_kib(tracemalloc.get_tracemalloc_memory())}"]
    out.append(mallinfo())
    out.append("\n== top lines ==")
    for st in snap.statistics("lineno")[:TOP]:
        out.append(f"{_kib(st.size)} {st.count:8d}  {st.traceback[0]}")
    if base is not None:
        diff = snap.compare_to(base, "traceback")
        grown = sum(d.size_diff for d in diff)
        out.append(f"\n== growth since snapshot 0: {_kib(grown)} ==")
        for d in diff[:TOP]:
            out.append(f"{_kib(d.size_diff)} {d.count_diff:+8d}")
            out.extend(f"      {line}" for line in d.traceback.format(most_recent_first=True)[:12])
        out.append("\n== growth since snapshot 0 by line ==")
        for d in snap.compare_to(base, "lineno")[:TOP]:
            out.append(f"{_kib(d.size_diff)} {d.count_diff:+8d}  {d.traceback[0]}")
    return "\n".join(out) + "\n"


def main() -> None:
    dump_dir = Path(sys.argv[1])
    sys.argv = ["bc", *sys.argv[2:]]
    frames = int(os.environ.get("BENCH_TRACE_FRAMES", "16"))
    if frames > 0:  # 0: malloc's figures only, without tracemalloc's own cost in them
        tracemalloc.start(frames)
    snaps: list[tracemalloc.Snapshot | None] = []

    def on_usr2(_sig: int, _frame: FrameType | None) -> None:
        snap = tracemalloc.take_snapshot().filter_traces(_EXCLUDE) if frames > 0 else None
        text = report(snap, snaps[0] if snaps else None)
        path = dump_dir / f"snapshot-{len(snaps)}.txt"
        snaps.append(snap)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.rename(path)  # whole or absent: the harness waits for the name

    signal.signal(signal.SIGUSR2, on_usr2)
    from bc.cli.entry import main as bc_main

    bc_main()


if __name__ == "__main__":
    main()
