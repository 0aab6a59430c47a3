"""What an operator reads after `bc sim`: the summary text and the `--json` document. Pure: no I/O.

The summary says, in this order: what ran (nodes, chaos, seed, simulated and wall time, events), the
work done (the workload's mix, `bc.sim.workload`), the faults injected by type, one line per invariant
(`pass`, or `FAIL` with the first counterexample: its sentence names the facts behind it, and the
simulated time it happened), the digest of the events log, and the exact command that replays the run.

`to_json` carries the same facts with stable keys: `digest`, `invariants` (a list of `{id, name, ok,
counterexample, at_ms, entities, trace}`: a failed one's trace is the last events that touched what it
names, `bc.sim.trace`), `faults`, `link_faults` and `work` (by type, sorted), `seed`, `nodes`, `chaos`,
`sim_seconds`, `wall_seconds`, `events`, `ok` and `repro`, and `gateways` (how many ran) with
`gateway_fences` (how many times one fenced itself; counted with several gateways), and `coverage` (a list of
`{invariant, what, count, few}`: `bc.sim.coverage`) when the run recorded its facts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

from bc.sim.coverage import FEW, Situation


class Invariant(Protocol):
    """`bc.sim.checkers.InvariantResult`."""

    @property
    def id(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def ok(self) -> bool: ...
    @property
    def counterexample(self) -> str | None: ...
    @property
    def at_ms(self) -> int | None: ...
    @property
    def entities(self) -> tuple[str, ...]: ...


class Result(Protocol):
    """`bc.sim.fleet.SimResult`: what one run came to."""

    @property
    def digest(self) -> str: ...
    @property
    def events(self) -> int: ...
    @property
    def faults(self) -> Mapping[str, int]: ...
    @property
    def work(self) -> Mapping[str, int]: ...
    @property
    def link_faults(self) -> Mapping[str, int]: ...
    @property
    def invariants(self) -> Sequence[Invariant]: ...
    @property
    def sim_seconds(self) -> float: ...
    @property
    def wall_seconds(self) -> float: ...
    @property
    def repro(self) -> str: ...
    @property
    def gateway_fences(self) -> int: ...
    @property
    def traces(self) -> Mapping[str, list[str]]: ...


class Config(Protocol):
    """`bc.sim.fleet.SimConfig`: what was asked for."""

    @property
    def nodes(self) -> int: ...
    @property
    def seed(self) -> int: ...
    @property
    def chaos(self) -> str: ...
    @property
    def gateways(self) -> int: ...


def all_ok(result: Result) -> bool:
    return all(i.ok for i in result.invariants)


def speedup(result: Result) -> float:
    """Simulated seconds per wall second (0 when the run took no measurable wall time)."""
    return result.sim_seconds / result.wall_seconds if result.wall_seconds > 0 else 0.0


def sim_time(at_ms: int) -> str:
    """A simulated instant as the store's clock reads it (UTC, to the millisecond)."""
    return datetime.fromtimestamp(at_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def _counts(title: str, counts: Mapping[str, int]) -> list[str]:
    if not any(counts.values()):
        return [f"{title}: none"]
    width = max(len(k) for k in counts)
    lines = [f"{title}:"]
    lines += [f"  {k:<{width}}  {v:>8,}" for k, v in sorted(counts.items()) if v]
    return lines


def invariant_line(inv: Invariant) -> str:
    if inv.ok:
        return f"  pass  {inv.id}  {inv.name}"
    told = inv.counterexample or "violated"
    told = told.removeprefix(f"{inv.id}: ")  # the checkers' sentences may name their invariant: once is enough
    line = f"  FAIL  {inv.id}  {inv.name}: {told}"
    if inv.at_ms is not None:
        line += f" (at {sim_time(inv.at_ms)}, simulated)"
    return line


def coverage_lines(situations: Sequence[Situation]) -> list[str]:
    """`--coverage`: per invariant, how often its dangerous situation happened; too few is said."""
    lines = ["coverage (how often each invariant's dangerous situation happened):"]
    for s in situations:
        note = f"  (fewer than {FEW}: a pass here is weak evidence)" if s.few else ""
        lines.append(f"  {s.invariant}  {s.count:>8,}  {s.what}{note}")
    return lines


def summary(result: Result, cfg: Config, situations: Sequence[Situation] | None = None) -> str:
    """The text `bc sim` prints on stdout when the run ends (with `situations`, its coverage too)."""
    gateways = f", {cfg.gateways} gateways" if cfg.gateways > 1 else ""
    head = (
        f"bc sim: {cfg.nodes:,} nodes{gateways}, chaos {cfg.chaos}, seed {cfg.seed}:"
        f" {result.sim_seconds:,.0f} s simulated in {result.wall_seconds:,.1f} s wall"
        f" ({speedup(result):,.0f}x real time), {result.events:,} events"
    )
    lines = [head, ""]
    lines += _counts("work", result.work)
    lines += _counts("faults", result.faults)
    lines += _counts("links", result.link_faults)
    if cfg.gateways > 1:
        lines.append(f"gateways: {cfg.gateways}, fenced themselves {result.gateway_fences:,} times")
    lines.append("invariants:")
    for i in result.invariants:
        lines.append(invariant_line(i))
        told = result.traces.get(i.id, [])
        if told:
            lines.append(f"        the last events touching {', '.join(i.entities[:4])}:")
            lines += [f"          {t}" for t in told]
    if situations is not None:
        lines += coverage_lines(situations)
    verdict = "every invariant holds" if all_ok(result) else "an invariant FAILED"
    lines += ["", f"digest: {result.digest}", f"result: {verdict}", f"reproduce: {result.repro}"]
    return "\n".join(lines)


def to_json(result: Result, cfg: Config, situations: Sequence[Situation] | None = None) -> dict[str, Any]:
    """The `--json` document (keys documented in the module docstring)."""
    doc = {
        "ok": all_ok(result),
        "digest": result.digest,
        "seed": cfg.seed,
        "nodes": cfg.nodes,
        "gateways": cfg.gateways,
        "gateway_fences": result.gateway_fences,
        "chaos": cfg.chaos,
        "sim_seconds": result.sim_seconds,
        "wall_seconds": round(result.wall_seconds, 3),
        "events": result.events,
        "invariants": [
            {
                "id": i.id,
                "name": i.name,
                "ok": i.ok,
                "counterexample": i.counterexample,
                "at_ms": i.at_ms,
                "entities": list(i.entities),
                "trace": result.traces.get(i.id, []),
            }
            for i in result.invariants
        ],
        "faults": dict(sorted(result.faults.items())),
        "link_faults": dict(sorted(result.link_faults.items())),
        "work": dict(sorted(result.work.items())),
        "repro": result.repro,
    }
    if situations is not None:
        doc["coverage"] = [
            {"invariant": s.invariant, "what": s.what, "count": s.count, "few": s.few} for s in situations
        ]
    return doc
