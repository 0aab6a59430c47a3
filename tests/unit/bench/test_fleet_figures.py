"""The fleet benchmark's arithmetic (bench.fleet_figures) and the generator's log counter (bench.fleet_gen)."""

from __future__ import annotations

import logging
import math

from hypothesis import given
from hypothesis import strategies as st

from bench.fleet_figures import (
    figure_line,
    kib_per_session,
    last_gateway_stats,
    parse_loadavg,
    per_session_second_ms,
    sessions_per_core,
    stat_cpu_s,
    status_rss_kib,
    summed,
)
from bench.fleet_gen import EndCounter
from bench.stats import pct

# A real /proc/PID/stat line whose process name holds a space and a parenthesis: fields count from the last ")".
STAT = (
    "4242 (bc serve (gw) x) S 1 4242 4242 0 -1 4194560 25000 0 12 0 "
    "1234 567 0 0 20 0 9 0 100 300000000 22000 18446744073709551615 1 1 0 0 0 0 0 16781312 17642 0 0 0 17 1 0 0"
)


def test_stat_cpu_is_utime_plus_stime_in_seconds() -> None:
    assert stat_cpu_s(STAT, 100) == (1234 + 567) / 100


def test_status_rss_and_a_process_without_one() -> None:
    assert status_rss_kib("Name:\tbc\nVmPeak:\t 999 kB\nVmRSS:\t   88123 kB\nThreads:\t9\n") == 88123
    assert status_rss_kib("Name:\tbc\nState:\tZ (zombie)\n") == 0


def test_loadavg_takes_load1_and_the_runnable_count() -> None:
    load = parse_loadavg("7.18 6.43 5.18 14/243 20858\n", 2)
    assert (load.cores, load.load1, load.running) == (2, 7.18, 14)
    assert figure_line("storm", '{"all_back_s": 1.4}', load) == (
        'storm: {"all_back_s": 1.4} [cores=2 load1=7.18 run_queue=14]'
    )


@given(
    cpu=st.floats(min_value=0, max_value=1e4),
    sessions=st.integers(min_value=1, max_value=100_000),
    window=st.floats(min_value=0.1, max_value=3600),
)
def test_per_session_second_times_sessions_and_window_gives_the_cpu_back(
    cpu: float, sessions: int, window: float
) -> None:
    ms = per_session_second_ms(cpu, sessions, window)
    assert math.isclose(ms * sessions * window / 1000, cpu, rel_tol=1e-9, abs_tol=1e-12)


def test_no_sessions_or_no_window_is_zero_not_a_division_error() -> None:
    assert per_session_second_ms(3.0, 0, 10.0) == 0.0
    assert per_session_second_ms(3.0, 10, 0.0) == 0.0
    assert kib_per_session(5000, 1000, 0) == 0.0
    assert sessions_per_core(0.0) == 0


def test_a_figure_per_session() -> None:
    # 3 gateways at 30 % of a core each over 10 s holding 1,000 sessions: 0.9 ms per session-second.
    assert math.isclose(per_session_second_ms(9.0, 1000, 10.0), 0.9)
    assert sessions_per_core(0.9) == 1111
    assert kib_per_session(3 * 90_000 + 100_000, 3 * 90_000, 1000) == 100.0


def test_the_last_stats_line_of_a_gateway_log() -> None:
    log = "\n".join(
        [
            "ts=2026-12-07 15:00:00,000 level=INFO event=gateway.stats gateway=gw-0 sessions=3 streams_refused=1",
            "ts=2026-12-07 15:00:05,000 level=INFO event=session.open node=r00001",
            "ts=2026-12-07 15:00:10,000 level=INFO event=gateway.stats gateway=gw-0 sessions=5 sessions_opened=9 "
            "streams_refused=40 status_written=12",
        ]
    )
    assert last_gateway_stats(log) == {"sessions": 5, "sessions_opened": 9, "streams_refused": 40, "status_written": 12}
    assert last_gateway_stats("no stats yet\n") == {}


def test_summed_over_generator_reports() -> None:
    assert summed([{"cpu_s": 1.5, "connected": 500}, {"cpu_s": 2.0}], "cpu_s") == 3.5
    assert summed([{"cpu_s": 1.5, "connected": 500}, {"cpu_s": 2.0}], "connected") == 500


def test_pct_is_nearest_rank() -> None:
    samples = [float(i) for i in range(1, 101)]
    assert pct(samples, 0.99) == 100.0
    assert pct(samples, 0.5) == 51.0


def _record(msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("agent", logging.WARNING, __file__, 1, msg, args, None)


def test_the_generator_counts_refusals_by_code_and_sessions_given_up() -> None:
    ends = EndCounter()
    fmt = "event=session.ended code=%s reason=%s details=%s"
    ends.handle(_record(fmt, "RESOURCE_EXHAUSTED", "OVERLOADED", "admission"))
    ends.handle(_record(fmt, "RESOURCE_EXHAUSTED", "OVERLOADED", "admission"))
    ends.handle(_record(fmt, "UNAVAILABLE", "UNSPECIFIED", "gateway gone"))
    ends.handle(_record("event=session.failed error=%s", "timed out"))
    ends.handle(_record("event=agent.revoked reason=%s; not redialing with this certificate", "revoked"))
    assert ends.doc() == {"refused_retry_after": 2, "closed_or_refused": 3, "refused_for_good": 1}
