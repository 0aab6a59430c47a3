"""A node that runs release sequence 2 is offered another release at that same sequence: the older 1.1.0 with
its sequence set to 2, and a build the key signed at sequence 2 under another version (a rebuild, or a second
install signing with the same key). A sequence equal to the one the node runs is not newer: both are refused
and the node keeps running 1.2.0. The exact release it runs, offered again, is no swap and no error."""

from __future__ import annotations

import json
from pathlib import Path

from tests.integration.conftest import InprocLab
from tests.integration.test_self_update_inprocess import lab
from tests.security.releases_helpers import build, offer, offer_of, running_release, slots_now

__all__ = ["lab"]


async def test_a_release_at_the_sequence_the_node_runs_is_refused(lab: InprocLab, tmp_path: Path) -> None:
    node, old, new = await running_release(lab, tmp_path)
    before = slots_now(node)

    replayed = await offer(lab, node, offer_of(old, sequence=new.sequence))
    assert not replayed.swapped, "1.1.0 replayed at the running sequence was swapped in"
    assert (replayed.state, replayed.reason) == ("failed", "bad-release"), replayed

    rebuild = build(lab, "1.2.0-rebuild", new.sequence)
    resigned = await offer(lab, node, rebuild.offer())
    assert not resigned.swapped, "a second release signed at the running sequence was swapped in"
    assert (resigned.state, resigned.reason) == ("failed", "not-newer"), resigned

    same = await offer(lab, node, offer_of(new))
    assert (same.swapped, same.state) == (False, "succeeded"), same
    assert json.loads(same.result_json)["swapped"] is False
    assert slots_now(node) == before and not list(node.install_dir.glob("*.partial"))
