"""A `bc serve --roles gateway,worker` beside an api-only one: keys follow roles, no CA key without the api role.

Real servers in this process (real gRPC on 127.0.0.1, real certificates, one SQLite file or one PostgreSQL
schema) and a real agent on fake GPUs. The gateway+worker process holds what its two roles need and nothing
more: its own serving key (the certificate issued by the api through the store, as for a gateway-only
process) and the worker key copied from the api's `pki/signing/` (as for a worker-only process). No CA key
and no root key is read or created. The node joins through it (Join forwarded to the api), holds its session
there, and a hold placed by its placement pass (the api process runs no worker loop) is signed by the worker
key and accepted; a command asked of the api runs. Without the worker key while the install signs it refuses
to start and writes nothing, not even its serving key or its certificate request; with a whole copy of the
api's data dir it still reads neither the CA key nor the root key.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent.join import join_node
from bc.assembly.server import Seams, Server
from bc.errors import UsageError
from bc.pki.signing import SIGNING_DIR
from bc.store import gateway_keys as gk_sql
from bc.store import nodes as nodes_sql
from tests.integration.conftest import InprocLab, open_lab, role_options
from tests.integration.test_worker_keys import copy_worker_key, files_under, start_failing


@contextlib.asynccontextmanager
async def api_only(tmp_path: Path, store_url: str) -> AsyncIterator[tuple[InprocLab, str]]:
    """The lab's server serves api alone (no session, no worker loop); the shared store's URL."""
    shared = store_url or str(tmp_path / "server" / "bc.db")
    async with open_lab(tmp_path, store=shared, roles=frozenset({"api"})) as lab:
        yield lab, shared


def gateway_worker(tmp_path: Path, shared: str, name: str = "gw-w") -> Server:
    return Server(role_options(tmp_path / name, shared, "gateway,worker", name, 30.0), Seams.production())


async def test_a_gateway_worker_process_holds_no_ca_or_root_key_and_still_joins_serves_and_signs(
    tmp_path: Path, store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="bc.join_proxy")
    async with api_only(tmp_path, store_url) as (lab, shared):
        copy_worker_key(tmp_path / "server", tmp_path / "gw-w")
        gw = gateway_worker(tmp_path, shared)
        try:
            await gw.start()
            # Its data dir: the three signing files it was given and the serving key it made; no CA, no root,
            # no operator config, no TLS key of a CA of its own.
            holds = ["gateway/serving.key", "pki/signing/root.crt", "pki/signing/worker.crt", "pki/signing/worker.key"]
            assert files_under(tmp_path / "gw-w") == holds
            assert gw.ca is None and gw.join_proxy is not None and gw.operator_config is None
            assert gw.ca_cert == lab.server.ca_cert, "the CA certificate came from the store"
            held, api_keys = gw.signer.keys, lab.server.signer.keys
            assert held is not None and api_keys is not None and held.worker.key_id == api_keys.worker.key_id

            tok = await lab.admin.create_token("n1")
            await join_node(gw.address, tok.token, lab.node_dir("n1"))
            assert "event=join-proxy.forwarded" in caplog.text, "the join went through the gateway's proxy"
            await lab.start_node("n1")
            await lab.wait_connected("n1", timeout=30)
            assert (await lab.admin.get_node("n1")).gateway_id == "gw-w"
            await lab.wait_observed("n1", 1, timeout=30)

            # Placed by the gateway+worker's placement pass, signed by the worker key, accepted by the node.
            res = await lab.admin.reserve(1, node_id="n1")
            await lab.wait_event("reservation.active", lambda ev, d: ev.subject == res.id, timeout=30)
            assert gw.store is not None
            async with gw.store.transaction(write=False) as tx:
                row = await nodes_sql.spec_delivery(tx, "n1")
            assert row is not None and row["spec_key_id"] == held.worker.key_id and row["spec_signature"]

            cmd = await lab.admin.run_command("n1", "inventory.refresh")
            await lab.wait_event("command.settled", lambda ev, d: ev.subject == cmd.id, timeout=30)
            assert (await lab.admin.get_command(cmd.id)).state == "succeeded"
            assert await lab.admin.list_events(type_prefix="security.") == []
            assert files_under(tmp_path / "gw-w") == holds, "serving made no key"
        finally:
            await gw.stop()


async def test_a_gateway_worker_process_without_the_worker_key_refuses_before_writing_anything(
    tmp_path: Path, store_url: str
) -> None:
    async with api_only(tmp_path, store_url) as (lab, shared):
        gw = gateway_worker(tmp_path, shared, "gw-empty")
        with pytest.raises(UsageError, match=r"command signing is on for this install and .* holds no worker key"):
            await start_failing(gw)
        assert files_under(tmp_path / "gw-empty") == [], "no CA, no signing key, no serving key was made"
        assert lab.server.store is not None
        async with lab.server.store.transaction(write=False) as tx:
            assert await gk_sql.serving_cert(tx, "gw-empty") is None, "no certificate was asked for"


async def test_a_gateway_worker_process_reads_neither_the_ca_key_nor_the_root_key_copied_beside_it(
    tmp_path: Path, store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="bc.serve")
    async with api_only(tmp_path, store_url) as (lab, shared):
        shutil.copytree(tmp_path / "server" / "pki", tmp_path / "gw-copy" / "pki")  # ca.key and root.key too
        before = files_under(tmp_path / "gw-copy")
        assert {"pki/ca.key", f"pki/{SIGNING_DIR}/root.key"} <= set(before)
        gw = gateway_worker(tmp_path, shared, "gw-copy")
        try:
            await gw.start()
            assert gw.ca is None and gw.join_proxy is not None, "no CA loaded: Join is forwarded to the api"
            assert "event=pki.ca-key-unused" in caplog.text and "event=pki.root-key-unused" in caplog.text
            assert files_under(tmp_path / "gw-copy") == sorted([*before, "gateway/serving.key"])
            tok = await lab.admin.create_token("n1")
            await join_node(gw.address, tok.token, lab.node_dir("n1"))
            assert (await lab.admin.get_node("n1")).node_id == "n1"
        finally:
            await gw.stop()
