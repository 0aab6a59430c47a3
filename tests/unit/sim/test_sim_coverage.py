"""`bc sim --coverage`: each invariant's dangerous situation counted from hand-made facts."""

from __future__ import annotations

from bc.control.capacity.usage_windows import UsageWindow
from bc.sim.coverage import FEW, coverage
from bc.sim.facts import Bound, FactLog
from tests.unit.capacity.fleet import H, atoms, booking


def counts(facts: FactLog) -> dict[str, int]:
    return {s.invariant: s.count for s in coverage(facts)}


def test_an_empty_run_counts_nothing_and_says_every_pass_is_weak() -> None:
    situations = coverage(FactLog())
    assert [s.invariant for s in situations] == ["I1", "I2", "I3", "I4", "I5", "I7", "I8"]
    assert all(s.count == 0 and s.few for s in situations)


def test_i1_counts_an_atom_handed_between_reservations_not_one_held_on() -> None:
    facts = FactLog()
    facts.bookings += [
        booking("r1", "n1", [0, 1], 0, H),
        booking("r2", "n1", [1], H, 2 * H),  # GPU 1 goes from r1 to r2
        booking("r2", "n1", [1], 2 * H, 3 * H),  # …and stays with r2
        booking("r3", "n2", [1], 0, H),  # another node's GPU 1
    ]
    assert counts(facts)["I1"] == 1


def test_i2_counts_restarts_and_journal_losses_close_after_a_command_started() -> None:
    facts = FactLog()
    facts.side_effect(1_000, "n1", "c1", "gpu.reset", "b1")
    facts.agent_restart(30_000, "n1", boot_changed=False)  # 29 s after c1 started: in flight
    facts.agent_restart(500_000, "n1", boot_changed=True)  # long after: nothing in flight
    facts.agent_restart(30_000, "n2", boot_changed=False)  # another node
    facts.journal_loss(40_000, "n1", "j1", "j2", ("c1", "c2"))  # two commands the lost journal held
    facts.redelivered(41_000, "n2", "c9", accepted=True)  # a command frame delivered again
    assert counts(facts)["I2"] == 4


def test_i3_to_i5_and_i8() -> None:
    facts = FactLog()
    facts.spec_delivered(10_000, "n1", 2)
    facts.outage(40_000, 90_000, "n1", "partition")  # 30 s after the delivery
    facts.spec_delivered(10_000, "n2", 2)  # n2 never goes away
    facts.connectivity_changed(45_000, "n1", "disconnected")
    facts.connectivity_changed(80_000, "n1", "unreachable")
    facts.connectivity_changed(95_000, "n1", "connected")
    facts.bound.append(Bound("n1", "r1", atoms("n1", 0), 0, 60_000))  # held until before the unreachable mark
    facts.journal_loss(50_000, "n1", "j1", "j2")  # lost its journal while it held r1
    facts.journal_loss(70_000, "n1", "j2", "j3")  # and again, once r1 was over
    facts.waited += ["r7", "r8"]
    window = UsageWindow("r1", "n1", "t", "gpu", 1, 0, H)
    facts.windows += [window, window]
    c = counts(facts)
    assert (c["I3"], c["I4"], c["I5"], c["I7"], c["I8"]) == (1, 1, 2, 2, 2)
    assert FEW == 10
