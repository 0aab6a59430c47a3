"""The key holder signed 1.3.0 for two platforms. A daemon.upgrade that moves a field under a signature made for
other fields must be refused before a byte is fetched: the other platform's build (its own signature and digest)
offered to this node as it is, or claiming this node's platform; this platform's signature over the other
build's digest; a signature of 1.3.0 under the version 1.3.1. Nothing is downloaded or swapped."""

from __future__ import annotations

from pathlib import Path

from tests.integration.conftest import InprocLab
from tests.integration.test_self_update_inprocess import lab
from tests.security.releases_helpers import ELSEWHERE, HERE, build, offer, running_release, slots_now

__all__ = ["lab"]


async def test_a_field_moved_under_another_signature_is_refused(lab: InprocLab, tmp_path: Path) -> None:
    node, _old, _new = await running_release(lab, tmp_path)
    before = slots_now(node)
    ours = build(lab, "1.3.0", 3)
    theirs = build(lab, "1.3.0", 3, on=ELSEWHERE)  # says `bc 1.3.0` too: only the platform tells it apart
    digest = {"sha256": theirs.fields["sha256"], "size": theirs.fields["size"], "url": theirs.url}

    cases = {
        "the other platform's build as it is": (theirs.offer(), "wrong-platform"),
        "the other platform's build claiming this one": (theirs.offer(platform=HERE), "bad-release"),
        "this platform's signature over the other build": (ours.offer(**digest), "bad-release"),
        "another version under the signature": (ours.offer(version="1.3.1"), "bad-release"),
    }
    for what, (fields, reason) in cases.items():
        got = await offer(lab, node, fields)
        assert not got.swapped, f"{what}: swapped in"
        assert (got.state, got.reason) == ("failed", reason), (what, got)
        assert slots_now(node) == before and not list(node.install_dir.glob("*.partial")), what
