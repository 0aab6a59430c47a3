"""A release whose signature and digest hold but whose binary is another version (a build mislabelled at publish,
the wrong file signed): 1.3.0 whose own `--version` says 1.2.9. The node runs the staged binary's `--version` in
its install dir before the swap and refuses it, naming both versions; nothing is swapped."""

from __future__ import annotations

from pathlib import Path

from agent.upgrade.slots import read_disk
from tests.integration.conftest import InprocLab
from tests.integration.test_self_update_inprocess import lab
from tests.security.releases_helpers import offer, offer_of, publish, running_release, slots_now

__all__ = ["lab"]


async def test_a_binary_whose_version_differs_is_not_swapped_in(lab: InprocLab, tmp_path: Path) -> None:
    node, _old, _new = await running_release(lab, tmp_path)
    before = slots_now(node)
    mislabelled = await publish(lab, "1.3.0", tmp_path, says="1.2.9")

    got = await offer(lab, node, offer_of(mislabelled))
    assert not got.swapped, "a binary that says it is 1.2.9 was swapped in as release 1.3.0"
    assert (got.state, got.reason) == ("failed", "version-mismatch"), got
    assert "'1.2.9', not release version '1.3.0'" in got.message
    assert slots_now(node) == before and not list(node.install_dir.glob("*.partial"))
    record = read_disk(node.install_dir).record
    assert (record.state, record.floor, read_disk(node.install_dir).current) == ("confirmed", 2, "b")
