"""A node that runs release sequence 2 is offered an older release the key really signed (1.1.0, sequence 1),
renumbered above it: whoever can send daemon.upgrade (an operator, or a control plane with a stolen worker key)
sets the sequence, which the signature did not cover. The node must refuse it and keep running 1.2.0 (TUF's
rollback rule); the older release at its own sequence is refused as not newer."""

from __future__ import annotations

from pathlib import Path

from agent.upgrade.slots import read_disk
from tests.integration.conftest import InprocLab
from tests.integration.test_self_update_inprocess import lab
from tests.security.releases_helpers import offer, offer_of, running_release, slots_now

__all__ = ["lab"]


async def test_an_older_release_renumbered_above_the_one_running_is_refused(lab: InprocLab, tmp_path: Path) -> None:
    node, old, _new = await running_release(lab, tmp_path)
    before = slots_now(node)

    renumbered = await offer(lab, node, offer_of(old, sequence=3))
    assert not renumbered.swapped, "the node swapped back to 1.1.0 under a sequence its signature never covered"
    assert (renumbered.state, renumbered.reason) == ("failed", "bad-release"), renumbered
    assert "sequence" in renumbered.message

    honest = await offer(lab, node, offer_of(old))
    assert not honest.swapped and (honest.state, honest.reason) == ("failed", "not-newer"), honest
    assert "not newer than the sequence 2 this node runs" in honest.message

    assert slots_now(node) == before and not list(node.install_dir.glob("*.partial"))
    assert read_disk(node.install_dir).record.floor == 2
