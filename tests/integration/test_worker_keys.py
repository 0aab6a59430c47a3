"""A worker-only `bc serve --roles worker` beside an api+gateway one: the worker key alone, from its own files.

Real servers in this process (real gRPC on 127.0.0.1, real certificates, one SQLite file or one PostgreSQL
schema) and a real agent on fake GPUs. The worker's data dir holds only the three signing files copied from
the api's `pki/signing/` (worker.key, worker.crt, root.crt); it reads the CA certificate from the store,
opens no listener, creates no key, and places a hold whose spec, signed by that worker key, the node
accepts. Without the worker key (signing on), with another install's, or an expired one, it refuses to
start in one sentence and writes nothing.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from bc.assembly.server import Seams, ServeOptions, Server
from bc.control.capacity.placement_pass import LEASE_NAME as PLACEMENT_LEASE
from bc.control.doctor.checks import LOOPS_FILE
from bc.errors import UsageError
from bc.pki import keys
from bc.pki.secrets_source import SystemSecrets, os_seeded_random
from bc.pki.signing import SIGNING_DIR, SigningKeys, issue_worker
from bc.seams.clock import SystemClock
from bc.store import leases
from bc.store import nodes as nodes_sql
from tests.integration.conftest import InprocLab, open_lab, role_options

WORKER_FILES = ("worker.key", "worker.crt", "root.crt")


def worker_options(tmp_path: Path, store: str, name: str = "worker") -> ServeOptions:
    return role_options(tmp_path / name, store, "worker", name, 10.0)


def copy_worker_key(api_dir: Path, worker_dir: Path) -> None:
    (worker_dir / "pki" / SIGNING_DIR).mkdir(parents=True, mode=0o700)
    for name in WORKER_FILES:
        shutil.copy2(api_dir / "pki" / SIGNING_DIR / name, worker_dir / "pki" / SIGNING_DIR / name)


def files_under(d: Path) -> list[str]:
    """The files a process made in its data dir, but the running server's report of its loops (`bc doctor`
    reads it; it holds no key)."""
    return sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file() and p.name != LOOPS_FILE)


@contextlib.asynccontextmanager
async def api_and_gateway(tmp_path: Path, store_url: str) -> AsyncIterator[tuple[InprocLab, str]]:
    """The lab's server serves api and gateway and runs no worker loop; the shared store's URL."""
    shared = store_url or str(tmp_path / "server" / "bc.db")
    async with open_lab(tmp_path, store=shared, roles=frozenset({"api", "gateway"})) as lab:
        yield lab, shared


async def test_a_worker_process_signs_with_the_worker_key_alone(tmp_path: Path, store_url: str) -> None:
    async with api_and_gateway(tmp_path, store_url) as (lab, shared):
        copy_worker_key(tmp_path / "server", tmp_path / "worker")
        worker = Server(worker_options(tmp_path, shared), Seams.production())
        try:
            await worker.start()
            assert worker.ca is None and worker.grpc_server is None and worker.address == ""
            keys_held = worker.signer.keys
            api_keys = lab.server.signer.keys
            assert keys_held is not None and api_keys is not None
            assert keys_held.worker.key_id == api_keys.worker.key_id
            assert worker.ca_cert == lab.server.ca_cert, "the CA certificate came from the store"
            # Nothing was created beside the copied files: no CA, no root key, no TLS key, no operator.
            assert files_under(tmp_path / "worker") == sorted(f"pki/signing/{n}" for n in WORKER_FILES)

            await lab.join("n1")
            await lab.start_node("n1")
            await lab.wait_observed("n1", 1)
            res = await lab.admin.reserve(1, node_id="n1")
            # Placed by the worker process (the api+gateway one runs no placement pass), its spec signed by
            # the worker key and accepted by the node.
            await lab.wait_event("reservation.active", lambda ev, d: ev.subject == res.id, timeout=30)
            assert worker.store is not None
            now_ms = await worker.store.now_ms()
            async with worker.store.transaction(write=False) as tx:
                row = await nodes_sql.spec_delivery(tx, "n1")
                assert await leases.held(tx, PLACEMENT_LEASE, worker.worker_id, now_ms, worker.store.dialect)
            assert row is not None and row["spec_key_id"] == keys_held.worker.key_id and row["spec_signature"]
            assert await lab.admin.list_events(type_prefix="security.") == []
        finally:
            await worker.stop()


async def test_a_worker_process_without_the_right_worker_key_refuses_to_start_and_writes_nothing(
    tmp_path: Path, store_url: str
) -> None:
    async with api_and_gateway(tmp_path, store_url) as (lab, shared):
        del lab
        # No worker key while the install signs.
        empty = worker_options(tmp_path, shared, "w-empty")
        with pytest.raises(UsageError, match=r"command signing is on for this install and .* holds no worker key"):
            await start_failing(Server(empty, Seams.production()))
        assert not (empty.data_dir / "pki").exists(), "no CA or signing key was created"

        # Another install's root and worker key.
        other = worker_options(tmp_path, shared, "w-other")
        SigningKeys.create(other.data_dir / "pki", SystemClock(), os_seeded_random(), SystemSecrets())
        before = files_under(other.data_dir)
        with pytest.raises(UsageError, match="under another command-signing root than this install's"):
            await start_failing(Server(other, Seams.production()))
        assert files_under(other.data_dir) == before

        # This install's root, but a worker key whose 90 days are over.
        expired = worker_options(tmp_path, shared, "w-expired")
        copy_worker_key(tmp_path / "server", expired.data_dir)
        signing = expired.data_dir / "pki" / SIGNING_DIR
        root_key = serialization.load_pem_private_key(
            (tmp_path / "server" / "pki" / SIGNING_DIR / "root.key").read_bytes(), password=None
        )
        assert isinstance(root_key, ed25519.Ed25519PrivateKey)
        root = keys.load_cert_pem((signing / "root.crt").read_bytes())
        key, cert = issue_worker(root_key, root, MonthsAgo(), os_seeded_random(), SystemSecrets())
        (signing / "worker.key").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        (signing / "worker.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        before = files_under(expired.data_dir)
        with pytest.raises(UsageError, match="has expired; rotate it on an api process"):
            await start_failing(Server(expired, Seams.production()))
        assert files_under(expired.data_dir) == before


class MonthsAgo(SystemClock):
    """The system clock, 100 days back: a worker key issued then has outlived its 90 days."""

    def now(self) -> float:
        return super().now() - 100 * 86400


async def start_failing(server: Server) -> None:
    """`start` that must raise; the half-started server is stopped either way (its store is open)."""
    try:
        await server.start()
    finally:
        await server.stop()
