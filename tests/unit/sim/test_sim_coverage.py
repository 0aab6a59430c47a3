"""`bc sim --coverage`: each invariant's dangerous situation counted from hand-made facts."""

from __future__ import annotations

from bc.control.capacity.usage_windows import UsageWindow
from bc.sim.coverage import FEW, coverage
from bc.sim.facts import BatchDecisions, Bound, FactLog
from tests.unit.capacity.fleet import H, atoms, booking


def counts(facts: FactLog) -> dict[str, int]:
    """Each invariant's first count (I3's second, stale specs, is `stale`)."""
    out: dict[str, int] = {}
    for s in coverage(facts):
        out.setdefault(s.invariant, s.count)
    return out


def stale(facts: FactLog) -> int:
    return next(s.count for s in coverage(facts) if s.what.startswith("specs delivered older"))


def test_an_empty_run_counts_nothing_and_says_every_pass_is_weak() -> None:
    situations = coverage(FactLog())
    assert [s.invariant for s in situations] == [
        "I1",
        "I2",
        "I3",
        "I3",
        "I4",
        "I5",
        "I7",
        "I8",
        "Q1",
    ]  # I3 counts two situations
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


def test_i3_counts_specs_delivered_older_than_the_one_applied_but_not_across_a_journal_loss() -> None:
    facts = FactLog()
    facts.spec_delivered(1_000, "n1", 1)  # nothing applied yet
    facts.spec_applied(1_000, "n1", "j1", 1)
    facts.spec_delivered(5_000, "n1", 3)
    facts.spec_applied(5_000, "n1", "j1", 3)
    facts.spec_delivered(5_000, "n1", 3)  # a duplicate: not older
    facts.spec_delivered(9_000, "n1", 1)  # stale
    facts.spec_delivered(9_000, "n2", 1)  # n2 applied nothing
    facts.journal_loss(10_000, "n1", "j1", "j2")
    facts.spec_delivered(12_000, "n1", 2)  # the fresh journal holds nothing: not stale
    facts.spec_applied(12_000, "n1", "j2", 2)
    facts.spec_delivered(13_000, "n1", 1)  # stale again, under j2
    assert stale(facts) == 2


def test_q1_counts_batches_one_key_or_one_operator_approved_more_than_once() -> None:
    facts = FactLog()
    facts.batch_decisions += [
        BatchDecisions("b1", (("k0", "alice"), ("k0b", "alice"), ("k1", "bob"))),  # alice's two keys
        BatchDecisions("b2", (("k1", "bob"), ("k1", "bob"))),  # one key twice
        BatchDecisions("b3", (("k0", "alice"), ("k1", "bob"))),  # two people
        BatchDecisions("b4", (("k9", ""), ("k8", ""))),  # keys from before operators: one each
        BatchDecisions("b5", ()),  # rejected, or never decided
    ]
    assert counts(facts)["Q1"] == 2
