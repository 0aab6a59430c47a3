"""Linux cpulists ("0-3,8,10-11"): the one strict parser the rules and the node share. Pure."""

from __future__ import annotations

MAX_ID = 65_535


def parse(text: str) -> tuple[int, ...]:
    """The ids a cpulist names, ascending and distinct; ValueError (one clause) when it is not one."""
    ids: set[int] = set()
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise ValueError(f"{text!r} is not a cpulist (e.g. 0-3,8)")
        a, b = int(lo), int(hi) if dash else int(lo)
        if a > b or b > MAX_ID:
            raise ValueError(f"{text!r} is not a cpulist (a range runs low to high, ids up to {MAX_ID})")
        ids.update(range(a, b + 1))
    return tuple(sorted(ids))


def render(ids: tuple[int, ...] | list[int]) -> str:
    """The shortest cpulist for these ids ("0-3,8")."""
    out: list[str] = []
    run: list[int] = []
    for i in sorted(set(ids)):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [i]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)
