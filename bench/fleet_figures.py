"""The fleet benchmark's arithmetic (`bench.fleet`): /proc parsed, figures computed, lines printed. No I/O.

A figure of a shared 2-core machine means little without the machine's state beside it, so every printed
figure carries the core count (`os.cpu_count()`) and the run queue at the time it was taken (/proc/loadavg:
the 1-minute load average, and the runnable entities at that instant, its fourth field's numerator).

CPU is read as utime + stime (/proc/PID/stat fields 14 and 15, in clock ticks) for another process, and
`resource.getrusage(RUSAGE_SELF)` inside a generator process; either way a figure per *session-second* is
the CPU spent over a window divided by the sessions held times the window's length: the cost of holding one
node connected for one second, which is what a gateway (or the generator, for the client side) is sized by.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


def stat_cpu_s(stat: str, ticks: int) -> float:
    """utime + stime in seconds from the text of /proc/PID/stat (the name in parentheses may hold spaces)."""
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / ticks


def status_rss_kib(status: str) -> int:
    """VmRSS in KiB from the text of /proc/PID/status (0 for a process without one: a zombie)."""
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


@dataclass(frozen=True)
class Load:
    """The machine when a figure was taken: 1-minute load average and runnable entities right then."""

    cores: int
    load1: float
    running: int

    def note(self) -> str:
        return f"[cores={self.cores} load1={self.load1:.2f} run_queue={self.running}]"


def parse_loadavg(text: str, cores: int) -> Load:
    """/proc/loadavg, e.g. `0.52 0.58 0.59 3/512 12345`: load1 and the runnable count (`3`)."""
    fields = text.split()
    return Load(cores=cores, load1=float(fields[0]), running=int(fields[3].split("/")[0]))


def per_session_second_ms(cpu_s: float, sessions: int, window_s: float) -> float:
    """Milliseconds of CPU per session-second: `cpu_s` spent over `window_s` while `sessions` were held."""
    if sessions <= 0 or window_s <= 0:
        return 0.0
    return 1000 * cpu_s / (sessions * window_s)


def kib_per_session(rss_kib: int, baseline_kib: int, sessions: int) -> float:
    """What a session adds to a process's resident set: (RSS now - RSS before any session) / sessions."""
    return (rss_kib - baseline_kib) / sessions if sessions > 0 else 0.0


def sessions_per_core(ms_per_session_second: float) -> int:
    """Sessions one core holds at this cost: 1000 ms of CPU a second over the cost of one session-second."""
    return int(1000 / ms_per_session_second) if ms_per_session_second > 0 else 0


_STATS = re.compile(r"event=gateway\.stats .*")
_COUNTER = re.compile(r"(\w+)=(\d+)")


def last_gateway_stats(log: str) -> dict[str, int]:
    """The counters of a gateway log's last `event=gateway.stats` line (cumulative since the process started)."""
    last = ""
    for line in log.splitlines():
        m = _STATS.search(line)
        if m:
            last = m.group(0)
    return {k: int(v) for k, v in _COUNTER.findall(last)}


def summed(docs: Sequence[Mapping[str, float]], key: str) -> float:
    """`key` summed over the generator processes' reports (a missing key counts 0)."""
    return sum(float(d.get(key, 0)) for d in docs)


def figure_line(name: str, value: str, load: Load) -> str:
    """One printed figure: its name, its value, and the machine's state beside it."""
    return f"{name}: {value} {load.note()}"
