"""A `daemon` section names a release that fails on the node (here its download: a mirror that drops every
connection, the URL being the one field no signature covers). The failure must be reported once on the section,
with its reason, and the release not tried again: not on later passes, not after the agent restarts (as systemd
restarts it), until another release is offered. Each attempt is one connection to the mirror, counted."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bc.protocol.pb import common_pb2
from tests.integration.conftest import InprocLab
from tests.integration.test_self_update_inprocess import lab, until
from tests.security.releases_helpers import offer_of, payload_json, publish, running_release

__all__ = ["lab"]


class Mirror:
    """A TCP listener that counts connections and drops each one: every download from it fails at once."""

    def __init__(self) -> None:
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def _drop(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        writer.close()

    async def url(self, sha256: str) -> str:
        self.server = await asyncio.start_server(self._drop, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"https://127.0.0.1:{port}/releases/{sha256}"


@pytest.fixture
async def mirror() -> AsyncIterator[Mirror]:
    m = Mirror()
    yield m
    if m.server is not None:
        m.server.close()
        await m.server.wait_closed()


async def daemon_section(lab: InprocLab) -> common_pb2.SectionStatus:
    shown = await lab.admin.get_node("n1")  # what `bc nodes show n1 [--json]` prints
    return next(s for s in shown.sections if s.section == "daemon")


async def test_a_failed_release_is_reported_once_and_not_tried_again(
    lab: InprocLab, tmp_path: Path, mirror: Mirror
) -> None:
    node, _old, _new = await running_release(lab, tmp_path)
    info = await publish(lab, "1.3.0", tmp_path)
    section = json.loads(payload_json(offer_of(info, url=await mirror.url(info.sha256))))
    spec = await lab.admin.set_spec_section("n1", "daemon", json.dumps(section))
    await lab.wait_observed("n1", spec.generation, timeout=30)
    failed = await daemon_section(lab)
    assert (failed.state, failed.reason) == (common_pb2.FAILED, "download-failed"), failed
    assert mirror.connections == 1

    # Later passes (a new generation) and a restart of the agent: the same release is not tried again.
    for i, restart in enumerate((False, True)):
        if restart:
            await lab.stop_node("n1")
            node.start("1.2.0")
        spec = await lab.admin.set_spec_section("n1", "telemetry", json.dumps({"export_interval_s": 10 + i}))
        await lab.wait_observed("n1", spec.generation, timeout=30)
        again = await daemon_section(lab)
        assert (again.state, again.reason, again.message) == (failed.state, failed.reason, failed.message)
        assert mirror.connections == 1, f"the failed release was tried again ({'restart' if restart else 'pass'})"

    # Another release is offered: that one is tried (and swapped in).
    newer = await publish(lab, "1.4.0", tmp_path)
    await lab.admin.set_spec_section("n1", "daemon", payload_json(offer_of(newer)))
    await until("the swap to 1.4.0", node.restarted.is_set, 30)
