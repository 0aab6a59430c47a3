"""`bc serve`: the control plane and the gateway in one process, on the embedded store.

First start creates the CA (`pki/ca.key`, 0600), the server's TLS certificate
and an operator certificate for the local operator (`operator/`), and writes
the operator's client config (see `bc.config`). Every later start reuses the
CA; the server certificate is reissued each start for the hosts it listens on.

`Server` finds nothing: its `Seams` — the clock, the one Random (ids,
serials) and the `Secrets` (keys, token secrets) — are passed in, and it
builds the `Signer` (signing on or off, as the install says) and the `Intent`
(the trust bundle) once at start and hands them to the servicers and the
gateway. `Seams.production()` is where production makes them: the system
clock, a Random seeded from the OS, and the OS CSPRNG. A restart must not
reuse a seeded Random's stream: the same seed on the same install would draw
the same certificate serials and token ids again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import signal
import socket
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from bc.api.admin_servicer import AdminServicer
from bc.api.join_servicer import JoinServicer
from bc.api.session_servicer import SessionServicer
from bc.clock import Clock, SystemClock
from bc.config import OperatorConfig, user_config_path
from bc.control import approvers, operators
from bc.control import intent as intent_ctl
from bc.control.bus import Bus
from bc.control.clock_skew import ClockSkewMonitor
from bc.control.intent import Intent
from bc.control.liveness import Liveness, LivenessConfig
from bc.control.placement_pass import LEASE_NAME as PLACEMENT_LEASE
from bc.control.placement_pass import PlacementPass
from bc.control.signer import KeySigner, NullSigner, Signer
from bc.control.sweeper import LEASE_NAME as SWEEPER_LEASE
from bc.control.sweeper import CommandSweeper
from bc.errors import UsageError
from bc.gateway.sessions import Gateway, GatewayConfig
from bc.jobs.engine import LEASE_NAME as JOBS_LEASE
from bc.jobs.engine import JobEngine
from bc.pki import keys
from bc.pki.ca import CertificateAuthority
from bc.pki.secrets_source import Secrets, SystemSecrets, os_seeded_random, p256_key
from bc.pki.signing import WORKER_ROTATE_BEFORE_S, SigningKeys
from bc.pki.tokens import ROOT_GRACE_S
from bc.protocol.limits import LIMITS
from bc.store import Store, StoreError, leases, open_store
from bc.store import identity as id_sql
from bc.wire.stubs import admin_pb2_grpc, join_pb2_grpc, session_pb2_grpc
from bc.wire.tls import ServerTLS

log = logging.getLogger("bc.serve")


@dataclass
class ServeOptions:
    data_dir: Path
    listen: str = "127.0.0.1:7443"
    advertise: list[str] = field(default_factory=list)
    heartbeat_interval_s: float = 10.0
    lease_ttl_s: float = 40.0
    unreachable_grace_s: float = 120.0
    command_signing: str | None = None  # "on" | "off" | None: on for a new install, as found otherwise
    node_cert_ttl_s: int = 24 * 3600  # hidden --node-cert-ttl: tests shorten it to see renewals; at most 24 h


def _worker_id(data_dir: Path, rng: random.Random) -> str:
    """This server's holder name for the singleton workers' store leases (the job queue, the sweeper):
    kept in the data dir, so a bc serve restarted after a crash takes back its own lease at once instead
    of waiting out the dead process's; two servers (two data dirs) on one store still differ."""
    path = data_dir / "worker-id"
    try:
        text = path.read_text("utf-8").strip()
    except FileNotFoundError:
        text = ""
    if not text:
        text = f"serve-{socket.gethostname()[:24]}-{rng.getrandbits(48):012x}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return text


def _host_port(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise UsageError(f"--listen must be HOST:PORT, not {listen!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def _client_address(host: str, port: int) -> str:
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _write_operator_config(data_dir: Path, ca: CertificateAuthority, server: str, secrets: Secrets) -> Path:
    op_dir = data_dir / "operator"
    cfg_path = op_dir / "config.json"
    if cfg_path.exists():
        cfg = OperatorConfig.load(cfg_path)
        if cfg.server == server:
            return cfg_path
        key_pem, cert_pem = cfg.key_pem, cfg.cert_pem
    else:
        key = p256_key(secrets)
        key_pem = keys.key_to_pem(key)
        cert_pem = keys.cert_to_pem(ca.issue_operator_cert("local", key))
    path = OperatorConfig.write(
        op_dir, server=server, ca_pem=ca.ca_pem, cert_pem=cert_pem, key_pem=key_pem, data_dir=data_dir
    )
    user = user_config_path()
    try:
        mine = not user.exists() or OperatorConfig.load(user).data_dir == str(data_dir)
    except UsageError:
        mine = False
    if mine:
        try:
            OperatorConfig.write(
                user.parent, server=server, ca_pem=ca.ca_pem, cert_pem=cert_pem, key_pem=key_pem, data_dir=data_dir
            )
        except OSError as e:  # a read-only home (systemd ProtectHome): the data dir's copy is enough
            log.warning("event=operator-config.user-copy-skipped path=%s error=%s", user, e.strerror or e)
    return path


@dataclass(frozen=True)
class Seams:
    """What a control-plane process is handed instead of finding it."""

    clock: Clock
    rng: random.Random  # ids, serials, jitter
    secrets: Secrets  # keys and token secrets

    @classmethod
    def production(cls) -> Seams:
        return cls(SystemClock(), os_seeded_random(), SystemSecrets())


class Server:
    """The running pieces of one `bc serve` process, for the CLI and for tests."""

    def __init__(self, opts: ServeOptions, seams: Seams) -> None:
        self.opts = opts
        self.clock = seams.clock
        self.rng = seams.rng
        self.secrets = seams.secrets
        self.bus = Bus()
        self.gateway_id = f"gw-{socket.gethostname()[:24]}-{self.rng.getrandbits(24):06x}"
        self.store: Store | None = None
        self.grpc_server: grpc.aio.Server | None = None
        self.port = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._rotate_at_start = False

    async def start(self) -> None:
        data_dir = self.opts.data_dir
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        host, port = _host_port(self.opts.listen)
        ca, created = CertificateAuthority.load_or_create(data_dir / "pki", self.clock, self.rng, self.secrets)
        if created:
            log.info("event=ca.created fingerprint=%s", ca.fingerprint)
        self.ca = ca
        self.store = await open_store(str(data_dir / "bc.db"), self.clock)
        self.worker_id = _worker_id(data_dir, self.rng)
        server_key = p256_key(self.secrets)
        hosts = sorted({host, *self.opts.advertise, socket.gethostname()} - {"0.0.0.0", "::"})
        server_cert = ca.issue_server_cert(hosts, server_key)
        sk = self._signing_keys(data_dir / "pki", created)
        self.signer: Signer = KeySigner(sk) if sk is not None else NullSigner()
        self.intent = Intent(self.signer, ca.ca_pem)
        await intent_ctl.register(self.store, self.signer)
        self.intent.set_quorum(*await approvers.trust_state(self.store))
        self.tls = ServerTLS(keys.key_to_pem(server_key), keys.cert_to_pem(server_cert) + ca.ca_pem, ca.ca_pem)
        await self._refresh_token_roots()
        self.bus.on_token_created(self.tls.add_token_root)

        self.gateway = Gateway(
            self.store,
            self.bus,
            self.clock,
            self.gateway_id,
            self.signer,
            self.intent,
            GatewayConfig(heartbeat_interval_s=self.opts.heartbeat_interval_s),
        )
        await self.gateway.renew_lease()
        if self._rotate_at_start:
            try:
                await intent_ctl.rotate(self.store, self.bus, self.signer, self.clock, self.rng, self.secrets)
            except UsageError as e:  # the root key is kept elsewhere: keep signing with the current worker
                log.warning("event=pki.worker-rotation-skipped reason=%s", e.message)
        self.liveness = Liveness(
            self.store,
            self.bus,
            self.gateway_id,
            LivenessConfig(
                lease_ttl_ms=int(self.opts.lease_ttl_s * 1000),
                unreachable_grace_ms=int(self.opts.unreachable_grace_s * 1000),
            ),
        )
        self.jobs = JobEngine(self.store, self.bus, self.signer, self.rng, holder=self.worker_id)
        self.placement = PlacementPass(self.store, self.bus, self.signer, self.rng, holder=self.worker_id)

        server = grpc.aio.server(
            options=[
                ("grpc.keepalive_time_ms", 20_000),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
                # Message limits from the one table (bc.protocol.limits): what every writer packs to, plus headroom.
                *LIMITS.grpc_options(),
            ]
        )
        session_pb2_grpc.add_NodeSessionServicer_to_server(SessionServicer(self.gateway, ca.certificate), server)
        join_pb2_grpc.add_JoinServicer_to_server(
            JoinServicer(self.store, self.bus, ca, self.signer, self.intent, node_cert_ttl_s=self.opts.node_cert_ttl_s),
            server,
        )
        admin_pb2_grpc.add_AdminServicer_to_server(
            AdminServicer(
                self.store,
                self.bus,
                ca,
                self.clock,
                self.gateway_id,
                signer=self.signer,
                rng=self.rng,
                secrets=self.secrets,
                jobs=self.jobs,
            ),
            server,
        )
        try:
            self.port = server.add_secure_port(
                f"{host}:{port}" if ":" not in host else f"[{host}]:{port}", self.tls.credentials()
            )
        except RuntimeError as e:
            raise UsageError(f"cannot listen on {self.opts.listen}: {e}") from None
        if self.port == 0:
            raise UsageError(f"cannot listen on {self.opts.listen}: the address is in use or not local")
        await server.start()
        self.grpc_server = server
        self.address = _client_address(host, self.port)
        self.operator_config = _write_operator_config(data_dir, ca, self.address, self.secrets)
        # The local operator is an admin; its certificate counts only once registered (bc.control.operators).
        await operators.register_local(
            self.store, keys.load_cert_pem(OperatorConfig.load(self.operator_config).cert_pem)
        )
        self._tasks.append(asyncio.create_task(self.gateway.lease_loop(), name="gateway-lease"))
        self._tasks.append(asyncio.create_task(self.gateway.revocation_loop(), name="revocation-feed"))
        self._tasks.append(asyncio.create_task(self._liveness_loop(), name="liveness"))
        self._tasks.append(asyncio.create_task(self._token_roots_loop(), name="token-roots"))
        self.sweeper = CommandSweeper(self.store, self.bus, self.worker_id)
        self._tasks.append(asyncio.create_task(self.sweeper.run_forever(self.clock), name="command-sweeper"))
        self._tasks.append(asyncio.create_task(self.jobs.run_forever(self.clock), name="jobs"))
        self._tasks.append(asyncio.create_task(self.placement.run_forever(self.clock), name="placement"))
        self.clock_skew = ClockSkewMonitor(self.store, self.clock)
        self._tasks.append(asyncio.create_task(self.clock_skew.run(), name="clock-skew"))
        log.info(
            "event=serve.started listen=%s store=%s gateway=%s ca=%s operator_config=%s",
            self.address,
            self.store.description,
            self.gateway_id,
            ca.fingerprint,
            self.operator_config,
        )

    def _signing_keys(self, pki_dir: Path, new_install: bool) -> SigningKeys | None:
        """Command signing is on for a new install unless asked otherwise; once on, it stays on.

        Nodes that hold the root refuse unsigned intent, so turning signing off
        would silently strand them: that takes a new install.
        """
        wanted = self.opts.command_signing
        if SigningKeys.exists(pki_dir):
            if wanted == "off":
                raise UsageError(
                    "command signing is on for this install and its nodes hold the signing root;"
                    " it cannot be turned off (start without --command-signing off)"
                )
            sk = SigningKeys.load(pki_dir)
            if sk.worker.not_after - self.clock.now() < WORKER_ROTATE_BEFORE_S:
                self._rotate_at_start = True
            return sk
        if wanted == "on" or (wanted is None and new_install):
            sk = SigningKeys.create(pki_dir, self.clock, self.rng, self.secrets)
            log.info("event=pki.signing-created root=%s worker=%s", keys.fingerprint(sk.root), sk.worker.key_id)
            return sk
        if wanted is None:
            log.warning("event=pki.signing-off hint='start once with --command-signing on to sign commands and specs'")
        return None

    async def _refresh_token_roots(self) -> None:
        assert self.store is not None
        now_ms = await self.store.now_ms()
        async with self.store.transaction(write=False) as tx:
            rows = await id_sql.trusted_token_roots(tx, now_ms, int(ROOT_GRACE_S * 1000))
        self.tls.set_token_roots({str(r["token_id"]): str(r["root_cert_pem"]).encode() for r in rows})

    async def _token_roots_loop(self) -> None:
        while True:
            await self.clock.sleep(5.0)
            with contextlib.suppress(StoreError):
                await self._refresh_token_roots()

    async def _liveness_loop(self) -> None:
        while True:
            try:
                await self.liveness.sweep_once()
            except StoreError as e:
                log.warning("event=liveness.failed error=%s", e)
            await self.clock.sleep(self.liveness.cfg.interval_s)

    async def stop(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.grpc_server is not None:
            await self.grpc_server.stop(grace=1.0)
            try:
                async with asyncio.timeout(5.0):
                    await self.gateway.drain()
            except TimeoutError:
                log.warning("event=serve.drain-timeout sessions=%d", len(self.gateway.sessions))
        if self.store is not None:
            with contextlib.suppress(StoreError):
                await self.gateway.release_lease()
            with contextlib.suppress(StoreError):
                # The singletons' leases go with this process, so another bc serve takes over at once.
                async with self.store.transaction() as tx:
                    for name in (JOBS_LEASE, SWEEPER_LEASE, PLACEMENT_LEASE):
                        await leases.release(tx, name, self.worker_id)
            await self.store.close()


async def run_serve(opts: ServeOptions) -> None:
    from bc import logs

    logs.setup("serve")
    server = Server(opts, Seams.production())
    await server.start()
    print(f"bc serve listening on {server.address}; operator config {server.operator_config}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        log.info("event=serve.stopping")
        await server.stop()
