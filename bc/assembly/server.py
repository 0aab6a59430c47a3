"""`bc serve`: the control plane and the gateway in one process, on the embedded store.

First start creates the CA (`pki/ca.key`, 0600), the server's TLS certificate
and an operator certificate for the local operator (`operator/`), and writes
the operator's client config (see `bc.runtime.config`). Every later start reuses the
CA; the server certificate is reissued each start for the hosts it listens on.

`Server` finds nothing: its `Seams` — the clock, the one Random (ids,
serials) and the `Secrets` (keys, token secrets) — are passed in, and it
builds the `Signer` (signing on or off, as the install says) and the `Intent`
(the trust bundle) once at start and hands them to the servicers and the
gateway. `Seams.production()` is where production makes them: the system
clock, a Random seeded from the OS, and the OS CSPRNG. A restart must not
reuse a seeded Random's stream: the same seed on the same install would draw
the same certificate serials and token ids again.

A process with the api role (a lab's, by default) holds the CA; one without it holds what its other roles
need and no CA or root key (`bc.assembly.roles`, "keys follow roles"): its CA certificate, and a gateway's
serving certificate, come from the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import random
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import grpc
from cryptography import x509

from bc.api.admin_servicer import AdminServicer
from bc.api.api_link import ApiLink
from bc.api.join_proxy import JoinProxy
from bc.api.join_servicer import JoinServicer
from bc.api.release_http import ReleaseServer
from bc.api.secret_broker import SecretBrokerServicer, SecretForwarder
from bc.api.session_servicer import SessionServicer
from bc.api.tunnel_route import GATEWAY_ENDPOINT_RENEW_S, GATEWAY_ENDPOINT_TTL_MS, GatewayRoute, RelayServicer
from bc.api.tunnel_servicer import NodeTunnelsServicer, TunnelsServicer
from bc.assembly.control import ControlSettings, build_control
from bc.assembly.lock import DataDirLock
from bc.assembly.loops import CA, GATEWAY_CERT, LISTENER, OTLP, SIGNING_KEYS, start_loops
from bc.assembly.retry import retry_start
from bc.assembly.roles import ROLES, KeyPlan
from bc.assembly.supervisor import Supervisor, states_json
from bc.assembly.worker_keys import worker_signer
from bc.control.base.bus import Bus
from bc.control.capacity.placement_pass import LEASE_NAME as PLACEMENT_LEASE
from bc.control.commands.sweeper import LEASE_NAME as SWEEPER_LEASE
from bc.control.doctor.checks import LOOPS_FILE
from bc.control.nodes.liveness import LEASE_NAME as LIVENESS_LEASE
from bc.control.secrets.broker import SecretBroker
from bc.control.signing.signer import KeylessSigner, KeySigner, NullSigner, Signer
from bc.control.trust import identity, operators
from bc.control.trust import intent as intent_ctl
from bc.control.trust import serving_certs as serving_ctl
from bc.control.trust import tunnels as tunnels_ctl
from bc.control.trust.intent import Intent
from bc.control.trust.serving_certs import GatewayCert
from bc.control.trust.sources import LocalTrust, RelayedTrust, TrustSource
from bc.errors import BcError, Conflict, UsageError
from bc.gateway import lease as lease_rule
from bc.gateway.session_driver import SecretPort
from bc.gateway.sessions import (
    GATEWAY_LEASE_RENEW_S,
    GATEWAY_LEASE_TTL_MS,
)
from bc.jobs.engine import LEASE_NAME as JOBS_LEASE
from bc.jobs.health import LEASE_NAME as HEALTH_LEASE
from bc.otel.config import OtlpConfig
from bc.pki import keys, serving
from bc.pki.ca import CA_KEY_FILE, LEAF_LIFETIME_S, CertificateAuthority
from bc.pki.identity import make_csr
from bc.pki.secret_box import SecretBox
from bc.pki.secrets_source import Secrets, SystemSecrets, os_seeded_random, p256_key
from bc.pki.serving import SERVING_CERT_TTL_S
from bc.pki.signing import ROOT_KEY, SIGNING_DIR, WORKER_ROTATE_BEFORE_S, SigningKeys
from bc.pki.tpm_ek import EK_ROOTS_FILE, load_roots
from bc.protocol.limits import LIMITS
from bc.runtime.aio import cancel_and_wait
from bc.runtime.config import OperatorConfig, user_config_path, user_copy
from bc.runtime.files import atomic_write
from bc.seams.clock import Clock, SystemClock
from bc.store import Store, StoreError, StoreUnreachable, leases, open_store
from bc.store import gateway_keys as gk_sql
from bc.store import nodes as nodes_sql
from bc.store.leases import Claim
from bc.wire.stubs import admin_pb2_grpc, join_pb2_grpc, secrets_pb2_grpc, session_pb2_grpc, tunnel_pb2_grpc
from bc.wire.tls import ServerTLS, channel_credentials

if TYPE_CHECKING:
    from bc.store.notify import PgRelay

log = logging.getLogger("bc.serve")

T = TypeVar("T")

KEYLESS_POLL_S = 1.0
API_ENDPOINT_TTL_MS = 20_000
API_ENDPOINT_RENEW_S = 5.0


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
    store: str = ""  # a store URL (postgresql://…); empty: the SQLite file bc.db in the data dir
    otlp: OtlpConfig | None = None  # --otlp-endpoint: export this process's metrics (bc.assembly.telemetry)
    release_listen: str = ""  # HOST:PORT of the HTTPS release server (bc.api.release_http); empty: none
    gateway_id: str = ""  # --gateway-id: this process's name among several on one store (its leases' holder)
    roles: frozenset[str] = ROLES  # --roles: what this process serves and runs (docs/fleet.md); a lab runs all
    api: list[str] = field(default_factory=list)  # --api: where a gateway without api forwards Join/Renew (else: store)
    serving_cert_ttl_s: float = SERVING_CERT_TTL_S  # hidden --serving-cert-ttl: keyless gateways' certificates
    serving_cert_wait_s: float = 120.0  # hidden --serving-cert-wait: how long a keyless gateway waits for one
    tunnels: bool = False  # --tunnels: make the exec-ticket key at start if there is none (docs/access.md)


def cross_process_relay(store: Store, bus: Bus, clock: Clock) -> PgRelay | None:
    """On PostgreSQL, the bus's wake-ups reach every other bc serve on the store (LISTEN/NOTIFY)."""
    if store.dialect != "postgres":
        return None
    from bc.store.notify import Incoming, PgRelay  # psycopg: only a fleet's bc serve loads it
    from bc.store.postgres import PostgresStore

    assert isinstance(store, PostgresStore)
    relay = PgRelay(store.url, clock, store.schema)
    bus.relay_to(relay)
    relay.start(Incoming(bus.local_node_changed, bus.local_events_published))
    return relay


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
        atomic_write(path, (text + "\n").encode(), 0o600)
    return text


def _absolute(data_dir: Path) -> Path:
    """The data dir as a lease holder names it: absolute (no filesystem call: `bc.gateway.lease`)."""
    return Path(os.path.abspath(data_dir))


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
            _copy_to_user_config(cfg, data_dir)
            return cfg_path
        key_pem, cert_pem = cfg.key_pem, cfg.cert_pem
    else:
        key = p256_key(secrets)
        key_pem = keys.key_to_pem(key)
        cert_pem = keys.cert_to_pem(ca.issue_operator_cert("local", key))
    path = OperatorConfig.write(
        op_dir, server=server, ca_pem=ca.ca_pem, cert_pem=cert_pem, key_pem=key_pem, data_dir=data_dir
    )
    _copy_to_user_config(OperatorConfig.load(path), data_dir)
    return path


def _copy_to_user_config(cfg: OperatorConfig, data_dir: Path) -> None:
    """Copy the operator config to `~/.config/bc/config.json` when `user_copy` allows it, and log either way."""
    user = user_config_path()
    try:
        there: str | None = OperatorConfig.load(user).data_dir if user.exists() else None
        unreadable = False
    except UsageError:
        there, unreadable = None, True
    decision = user_copy(there, str(data_dir), unreadable=unreadable)
    if not decision.write:
        log.warning(
            "event=operator-config.user-copy-kept path=%s reason=%r use=BC_CONFIG=%s",
            user,
            decision.reason,
            cfg.path,
        )
        return
    try:
        OperatorConfig.write(
            user.parent,
            server=cfg.server,
            ca_pem=cfg.ca_pem,
            cert_pem=cfg.cert_pem,
            key_pem=cfg.key_pem,
            data_dir=data_dir,
        )
    except OSError as e:  # a read-only home (systemd ProtectHome): the data dir's copy is enough
        log.warning("event=operator-config.user-copy-skipped path=%s error=%s", user, e.strerror or e)
        return
    log.info("event=operator-config.user-copy-written path=%s reason=%r", user, decision.reason)


def serve_has(plan: KeyPlan, *, signing: bool, otlp: bool) -> frozenset[str]:
    """What a `bc serve` with this key plan has beyond its roles (`bc.assembly.loops.Has`): what `Server` passes
    to `start_loops`; `signing`: its signer holds keys (command signing on, and a CA or a worker key)."""
    has = set()
    if plan.ca:
        has.add(CA)
    if plan.listens:
        has.add(LISTENER)
    if signing:
        has.add(SIGNING_KEYS)
    if plan.serving_from_store:
        has.add(GATEWAY_CERT)
    if otlp:
        has.add(OTLP)
    return frozenset(has)


StoreOpener = Callable[[str, Clock], Awaitable[Store]]
"""Opens (and migrates) the store at a URL: `bc.store.open_store`, or a test's store that can be killed."""


@dataclass(frozen=True)
class Seams:
    """What a control-plane process is handed instead of finding it."""

    clock: Clock
    rng: random.Random  # ids, serials, jitter
    secrets: Secrets  # keys and token secrets
    store_opener: StoreOpener = open_store  # tests/integration/test_store_outage.py passes a store it can kill

    @classmethod
    def production(cls) -> Seams:
        return cls(SystemClock(), os_seeded_random(), SystemSecrets())


class Server:
    """The running pieces of one `bc serve` process, for the CLI and for tests."""

    def __init__(self, opts: ServeOptions, seams: Seams) -> None:
        self.opts = opts
        self.plan = KeyPlan(opts.roles)  # which keys this process reads follows from its roles (bc.assembly.roles)
        self.clock = seams.clock
        self.rng = seams.rng
        self.secrets = seams.secrets
        self._open_store = seams.store_opener
        self.bus = Bus()
        self.gateway_id = opts.gateway_id or f"gw-{socket.gethostname()[:24]}-{self.rng.getrandbits(24):06x}"
        self.store: Store | None = None
        self.relay: PgRelay | None = None
        self.grpc_server: grpc.aio.Server | None = None
        self.port = 0
        self._tasks: list[asyncio.Task[None]] = []  # one-shots (a drain); the loops run under `supervisor`
        # One Random for every back-off (the supervisor's restarts, the start's retries): one draw from the seams'.
        self._jitter = random.Random(self.rng.getrandbits(64))
        self.supervisor = Supervisor(self.clock, self._jitter, process="serve")
        self.loops: list[str] = []  # the names of the loops this process runs (bc.assembly.loops)
        self.roles: frozenset[str] = opts.roles  # what it passes to start_loops: its roles and what it has
        self.has: frozenset[str] = frozenset()
        # <data-dir>/loops.json, rewritten off the event loop at each change of the loops' states (bc doctor reads it).
        self._loops_dirty = asyncio.Event()
        self._loops_closing = False
        self._loops_reporter: asyncio.Task[None] | None = None
        self.loops_written = asyncio.Event()  # set after each write of loops.json (tests clear it and wait)
        self._rotate_at_start = False
        self.stopped = asyncio.Event()  # set by a drain that finished: run_serve exits as on SIGTERM
        self.release_server: ReleaseServer | None = None
        self.release_url = ""
        self.api_address = ""  # where this api process registered itself (gateways proxy Join and Renew there)
        self.gateway_address = ""  # where this gateway registered itself (api processes relay tunnels through it)
        self.gateway_registered = asyncio.Event()  # set at its first registration (tests wait on it)
        self.intent: Intent  # what this process signs; a gateway-only process has none (it relays the stored trust)
        self.signer: Signer
        self.tls: ServerTLS
        self.ca_cert: x509.Certificate
        self.serving_key_pem = b""
        self.serving_chain = b""
        self.join_proxy: JoinProxy | None = None  # a gateway without the api role: Join and Renew, forwarded to an api
        self.data_dir_lock: DataDirLock | None = None  # held from start to stop: one bc serve per data dir
        self.claim: Claim | None = None  # this process's hold on its gateway's lease (bc.gateway.lease)
        self._claim_keeper: asyncio.Task[None] | None = None  # renews it while the start waits (a certificate)
        self.stop_error: BcError | None = None  # why this process stopped on its own (run_serve exits with it)

    async def start(self) -> None:
        """Start every role; a second bc serve on this data dir is refused first (`bc.assembly.lock`, exit 4)."""
        self.opts.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.data_dir_lock = DataDirLock(self.opts.data_dir)
        self.data_dir_lock.acquire()
        try:
            await self._start()
        except BaseException:
            if self._claim_keeper is not None:
                await cancel_and_wait([self._claim_keeper])
            if self.store is not None:
                with contextlib.suppress(StoreError):
                    if self.claim is not None and self.claim.epoch:  # a refused start took no lease
                        async with self.store.transaction() as tx:
                            await leases.give_up(tx, self.claim.name, self.claim.holder)
            self.data_dir_lock.release()
            raise

    async def _start(self) -> None:
        data_dir = self.opts.data_dir
        host, port = _host_port(self.opts.listen)
        roles = self.opts.roles
        # A store not reached yet (PostgreSQL starting, failing over) is waited for, saying why at each attempt;
        # one that answered with a refusal (a corrupt file, a wrong password) ends the start with its sentence.
        url = self.opts.store or str(data_dir / "bc.db")
        self.store = await retry_start(
            lambda: self._open_store(url, self.clock),
            what="store-open",
            clock=self.clock,
            rng=self._jitter,
            process="serve",
            retry_on=(StoreUnreachable,),
        )
        self.relay = cross_process_relay(self.store, self.bus, self.clock)
        # Named processes on one store (--gateway-id) hold the singleton workers' leases under that name and their
        # host and data dir (two processes started under one name are two holders: bc.gateway.lease); a lab's one
        # process keeps its id in the data dir. Either way a restart takes its own leases back at once.
        if self.opts.gateway_id:
            self.worker_id = lease_rule.holder_for(self.opts.gateway_id, socket.gethostname(), _absolute(data_dir))
        else:
            self.worker_id = _worker_id(data_dir, self.rng)
        if "gateway" in roles:
            # Before anything else that acts as this gateway (its serving certificate, its port): a second
            # process under a running gateway's id is refused here, exit 4 naming the holder.
            self.claim = await self._retry("gateway-lease", lambda: self._claim_gateway_lease(data_dir))
            self._claim_keeper = asyncio.create_task(self._keep_claim(self.claim), name="gateway-lease-start")
        self.ca: CertificateAuthority | None = None
        self.secret_box: SecretBox | None = None  # the secrets' at-rest key, beside the CA (docs/secrets.md)
        self.secret_broker: SecretBroker | None = None
        self.gateway_cert: GatewayCert | None = None
        self.trust: TrustSource
        if self.plan.ca:
            await self._start_with_keys(data_dir, host)
        else:
            await self._start_without_ca(data_dir, host)
        ca = self.ca
        secrets: SecretPort | None = None  # where the gateway's secret requests go (docs/secrets.md)
        if self.secret_box is not None:
            self.secret_broker = SecretBroker(self.store, self.bus, self.secret_box)
            secrets = self.secret_broker
        elif "gateway" in roles:
            secrets = SecretForwarder(self.gateway_id, self._api_addresses, ApiLink(self._api_credentials))

        # Every component, built in one place (bc.assembly.control) as the harness and bc sim build theirs.
        self.parts = build_control(
            self.store,
            self.bus,
            self.clock,
            self.rng,
            self.signer,
            self.trust,
            gateway_id=self.gateway_id,
            worker_id=self.worker_id,
            settings=ControlSettings(
                heartbeat_interval_s=self.opts.heartbeat_interval_s,
                lease_ttl_s=self.opts.lease_ttl_s,
                unreachable_grace_s=self.opts.unreachable_grace_s,
            ),
            claim=self.claim,
            secrets=secrets,
        )
        assert self.parts.gateway is not None and self.parts.jobs is not None and self.parts.clock_skew is not None
        self.gateway, self.jobs, self.clock_skew = self.parts.gateway, self.parts.jobs, self.parts.clock_skew
        if ca is not None:  # a provisioning job mints its machines' join tokens (bc.jobs.metal_steps)
            self.jobs.tokens = identity.TokenMint(ca.fingerprint, self.clock, self.secrets)
        self.gateway.on_superseded = self._superseded
        if "gateway" in roles:
            await self._retry("gateway-lease-renewal", self.gateway.renew_lease)
            if self.gateway.superseded:  # another process took the lease while this one started
                raise Conflict(self.gateway.superseded)
        if self._rotate_at_start:
            try:
                await intent_ctl.rotate(self.store, self.bus, self.signer, self.clock, self.rng, self.secrets)
            except UsageError as e:  # the root key is kept elsewhere: keep signing with the current worker
                log.warning("event=pki.worker-rotation-skipped reason=%s", e.message)

        if ca is not None and "api" in roles and self.opts.tunnels:
            # The exec-ticket key beside the CA, pinned in every node's access section (docs/access.md).
            store, signer, key_dir = self.store, self.signer, tunnels_ctl.key_dir(data_dir)
            await self._retry(
                "exec-ticket-key",
                lambda: tunnels_ctl.ensure_key(store, self.bus, signer, key_dir, self.secrets, self.rng),
            )

        self.address = ""  # a worker-only process serves no call, so it does not listen
        self.operator_config: Path | None = None
        # A port that accepts must mean the operator config is on disk and its operator registered, so a
        # script's `bc nodes` right after `bc serve` opens its port finds both. grpc accepts connections as
        # soon as the port is bound (`add_secure_port` listens; `start` only serves), so a fixed port's config
        # is written before it is bound; an ephemeral one (`:0`) is known only once bound, and nobody can
        # dial it before reading it from the config or the log line.
        known_port = self.plan.listens and port != 0
        if ca is not None and known_port:
            await self._write_local_operator(data_dir, ca, _client_address(host, port))
        if self.plan.listens:
            await self._serve_grpc(data_dir, host, port, ca)
        if ca is not None and not known_port:
            await self._write_local_operator(data_dir, ca, self.address)
        if self.grpc_server is not None:
            await self.grpc_server.start()
        if ca is not None and "api" in roles:
            self.parts.api_registry = functools.partial(self._api_loop, ca, host)
        if "gateway" in roles:
            self.parts.gateway_registry = functools.partial(self._gateway_loop, host)
        if self.gateway_cert is not None:
            self.parts.keyless = self._keyless_loop
        if "gateway" in roles and self._claim_keeper is not None:
            # The gateway-lease loop renews the claim from here on.
            await cancel_and_wait([self._claim_keeper])
            self._claim_keeper = None
        if self.opts.otlp is not None:
            from bc.assembly.telemetry import ServeTelemetry  # opentelemetry loads only when asked for

            telemetry = ServeTelemetry(
                self.opts.otlp,
                self.gateway_id,
                sessions=lambda: len(self.gateway.sessions),
                published=lambda: self.bus.published,
                clock_offset_ms=lambda: self.clock_skew.offset_ms,
                nodes_by_state=self._nodes_by_state,
                loops=self.supervisor.states,
            )
            self.parts.telemetry = telemetry.run
        self.has = self._has(ca)
        self.loops = start_loops(self.supervisor, self.roles, self.has, self.parts)
        # Attached once every loop is started: one first write, then one per change (bc doctor's `loops`).
        self.supervisor.on_change = lambda _states: self._loops_dirty.set()
        self._loops_dirty.set()
        self._loops_reporter = asyncio.create_task(self._report_loops(), name="loops-report")
        log.info(
            "event=serve.started listen=%s store=%s gateway=%s roles=%s ca=%s operator_config=%s",
            self.address or "-",
            self.store.description,
            self.gateway_id,
            ",".join(sorted(roles)),
            keys.fingerprint(self.ca_cert),
            self.operator_config or "-",
        )

    async def _write_local_operator(self, data_dir: Path, ca: CertificateAuthority, address: str) -> None:
        """The local operator's config (`<data-dir>/operator/`, and the user copy) naming `address`, and its
        certificate registered: the local operator is an admin, counted only once registered."""
        assert self.store is not None
        self.operator_config = _write_operator_config(data_dir, ca, address, self.secrets)
        operator_cert = keys.load_cert_pem(OperatorConfig.load(self.operator_config).cert_pem)
        store = self.store
        await self._retry("operator-register", lambda: operators.register_local(store, operator_cert))

    async def _serve_grpc(self, data_dir: Path, host: str, port: int, ca: CertificateAuthority | None) -> None:
        """The services this process's roles answer, on `--listen` (and the release server, if asked)."""
        assert self.store is not None
        roles = self.opts.roles
        server = grpc.aio.server(
            options=[
                ("grpc.keepalive_time_ms", 20_000),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
                # Message limits from the one table (bc.protocol.limits): what every writer packs to, plus headroom.
                *LIMITS.grpc_options(),
            ]
        )
        if "gateway" in roles:
            session_pb2_grpc.add_NodeSessionServicer_to_server(SessionServicer(self.gateway, self.ca_cert), server)
        if ca is not None and "api" in roles:
            join_pb2_grpc.add_JoinServicer_to_server(
                JoinServicer(
                    self.store,
                    self.bus,
                    ca,
                    self.signer,
                    self.intent,
                    node_cert_ttl_s=self.opts.node_cert_ttl_s,
                    secrets=self.secrets,
                    ek_roots=_ek_roots(data_dir / "pki" / EK_ROOTS_FILE),
                ),
                server,
            )
        elif self.plan.serving_from_store:
            self.join_proxy = JoinProxy(self.gateway_id, self._api_addresses, ApiLink(self._api_credentials))
            join_pb2_grpc.add_JoinServicer_to_server(self.join_proxy, server)
        if self.opts.release_listen:
            rhost, rport = _host_port(self.opts.release_listen)
            self.release_server = ReleaseServer(data_dir / "releases", self.serving_chain, self.serving_key_pem)
            try:
                bound = await self.release_server.start(rhost, rport)
            except OSError as e:
                raise UsageError(f"cannot listen on {self.opts.release_listen}: {e.strerror}") from None
            self.release_url = "https://" + _client_address(
                self.opts.advertise[0] if rhost in ("0.0.0.0", "::") and self.opts.advertise else rhost, bound
            )
        admin = (
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
                ssh_ca_dir=data_dir / "ssh-ca",
                secret_box=self.secret_box,
                releases_dir=data_dir / "releases",
                release_url=self.release_url,
                drain=self.drain if "gateway" in roles else None,
                placement=self.parts.placement,
            )
            if ca is not None and "api" in roles
            else None
        )
        if admin is not None:
            admin_pb2_grpc.add_AdminServicer_to_server(admin, server)
        if self.secret_broker is not None and ca is not None and "api" in roles:  # for keyless gateways' nodes
            secrets_pb2_grpc.add_SecretBrokerServicer_to_server(
                SecretBrokerServicer(self.secret_broker, ca.certificate), server
            )
        hub = self.gateway.tunnels if "gateway" in roles else None
        if hub is not None:
            tunnel_pb2_grpc.add_NodeTunnelsServicer_to_server(
                NodeTunnelsServicer(hub, self.ca_cert, self.gateway.refuse_revoked), server
            )
            tunnel_pb2_grpc.add_GatewayTunnelsServicer_to_server(
                RelayServicer(hub, self.ca_cert, self.gateway_id), server
            )
        if ca is not None and "api" in roles:
            tunnels = TunnelsServicer(
                self.store,
                self.bus,
                ca.certificate,
                signer=self.signer,
                rng=self.rng,
                secrets=self.secrets,
                key_dir=tunnels_ctl.key_dir(data_dir),
                hub=hub,
                gateway_id=self.gateway_id,
                route=GatewayRoute(self.store, self._process_credentials(ca, host)),
            )
            tunnel_pb2_grpc.add_TunnelsServicer_to_server(tunnels, server)
        try:
            self.port = server.add_secure_port(
                f"{host}:{port}" if ":" not in host else f"[{host}]:{port}", self.tls.credentials()
            )
        except RuntimeError as e:
            raise UsageError(f"cannot listen on {self.opts.listen}: {e}") from None
        if self.port == 0:
            raise UsageError(f"cannot listen on {self.opts.listen}: the address is in use or not local")
        self.grpc_server = server  # bound; it starts answering once the local operator's config is written
        self.address = _client_address(host, self.port)

    async def _start_with_keys(self, data_dir: Path, host: str) -> None:
        """The CA and the signing keys from the data dir (created on a first start); the trust published."""
        assert self.store is not None
        ca, created = CertificateAuthority.load_or_create(data_dir / "pki", self.clock, self.rng, self.secrets)
        if created:
            log.info("event=ca.created fingerprint=%s", ca.fingerprint)
        self.ca, self.ca_cert = ca, ca.certificate
        self.secret_box = await asyncio.to_thread(SecretBox.load_or_create, data_dir / "pki", self.secrets)
        server_key = p256_key(self.secrets)
        hosts = sorted({host, *self.opts.advertise, socket.gethostname()} - {"0.0.0.0", "::"})
        server_cert = ca.issue_server_cert(hosts, server_key)
        sk = self._signing_keys(data_dir / "pki", created)
        self.signer = KeySigner(sk) if sk is not None else NullSigner()
        self.intent = Intent(self.signer, ca.ca_pem)
        await self._register_intent()
        local = LocalTrust(self.intent)
        store = self.store
        # The quorum and release keys as stored; published for keyless gateways.
        await self._retry("trust-refresh", lambda: local.refresh(store))
        self.trust = local
        self.serving_key_pem = keys.key_to_pem(server_key)
        self.serving_chain = keys.cert_to_pem(server_cert) + ca.ca_pem
        self.tls = ServerTLS(self.serving_key_pem, self.serving_chain, ca.ca_pem)

    async def _start_without_ca(self, data_dir: Path, host: str) -> None:
        """No CA key and no root key (bc.assembly.roles): the CA certificate, and a gateway's serving certificate and
        the trust it relays, come from the store; a worker signs with the worker key from its own files.

        A worker's key is checked (`bc.assembly.worker_keys`, every refusal before anything is written) before a
        gateway asks for its certificate. Both waits share one bound, `serving_cert_wait_s`, for an api
        process to publish the CA and issue the certificate.
        """
        assert self.store is not None
        pki_dir = data_dir / "pki"
        unused = {"ca": pki_dir / CA_KEY_FILE, "root": pki_dir / SIGNING_DIR / ROOT_KEY}
        if self.plan.worker_key:
            del unused["root"]  # worker_signer says so
        for which, path in unused.items():
            if path.exists():
                log.warning(
                    "event=pki.%s-key-unused path=%s hint='a process without the api role never reads it'", which, path
                )
        deadline = asyncio.get_running_loop().time() + self.opts.serving_cert_wait_s
        relayed = RelayedTrust()
        if self.plan.worker_key:
            await self._wait_for_ca(relayed, deadline)
            self.signer = await worker_signer(self.store, pki_dir, relayed.trust_bundle(), self.clock.now())
        else:
            signer = KeylessSigner()
            store = self.store
            await self._retry("signer-refresh", lambda: signer.refresh(store))
            self.signer = signer
        if self.plan.serving_from_store:
            issued = await self._wait_for_serving_cert(data_dir, host, relayed, deadline)
            self.serving_key_pem, self.serving_chain = issued.key_pem, issued.cert_pem + relayed.ca_pem
            self.tls = ServerTLS(issued.key_pem, issued.cert_pem, relayed.ca_pem)
        self.ca_cert = keys.load_cert_pem(relayed.ca_pem)
        if self.plan.relays_trust:
            self.trust = relayed
            return
        self.intent = Intent(self.signer, relayed.ca_pem)
        await self._register_intent()
        local = LocalTrust(self.intent)
        store = self.store
        await self._retry("trust-refresh", lambda: local.refresh(store))
        self.trust = local

    async def _retry(self, what: str, step: Callable[[], Awaitable[T]]) -> T:
        """A start step that reaches the store, retried while the store is away (`bc.assembly.retry`)."""
        return await retry_start(step, what=what, clock=self.clock, rng=self._jitter, process="serve")

    async def _register_intent(self) -> None:
        assert self.store is not None
        store, signer = self.store, self.signer
        await self._retry("intent-register", lambda: intent_ctl.register(store, signer))

    async def _claim_gateway_lease(self, data_dir: Path) -> Claim:
        """Take this gateway's lease under this process's own holder, or refuse the start (exit 4): another
        process, from another data dir or host, serves this gateway id now (bc.gateway.lease)."""
        assert self.store is not None
        gid = self.gateway_id
        claim = Claim(lease_rule.name_of(gid), lease_rule.holder_for(gid, socket.gethostname(), _absolute(data_dir)))
        now_ms = await self.store.now_ms()
        async with self.store.transaction() as tx:
            got = await leases.take(tx, claim.name, claim.holder, now_ms, GATEWAY_LEASE_TTL_MS)
        if got.holder != claim.holder:
            raise Conflict(lease_rule.refusal(gid, got, now_ms))
        claim.epoch = got.epoch
        log.info("event=gateway.lease-taken gateway=%s holder=%s epoch=%d", gid, claim.holder, claim.epoch)
        return claim

    async def _keep_claim(self, claim: Claim) -> None:
        """Renew the lease while the start waits (a keyless gateway may wait minutes for its certificate; the
        lease lives 20 s), until the gateway's own lease loop takes over. What a renewal found is judged there."""
        assert self.store is not None
        while True:
            await self.clock.sleep(GATEWAY_LEASE_RENEW_S)
            try:
                now_ms = await self.store.now_ms()
                async with self.store.transaction() as tx:
                    await leases.take(tx, claim.name, claim.holder, now_ms, GATEWAY_LEASE_TTL_MS)
            except StoreError as e:
                log.warning("event=gateway.lease-failed error=%s", e)

    def _superseded(self, why: str) -> None:
        """Another process took this gateway's lease after this one: stop, and exit 4 with why (run_serve)."""
        self.stop_error = Conflict(why)
        self.stopped.set()

    async def _wait_for_ca(self, relayed: RelayedTrust, deadline: float) -> None:
        """Until an api process published the CA certificate (and the trust bundle with it)."""
        assert self.store is not None
        said = False
        try:
            async with asyncio.timeout_at(deadline):
                while not (await relayed.refresh(self.store) or relayed.ca_pem):
                    if not said:
                        log.warning("event=worker.waiting-for-ca waiting for an api process to publish the CA")
                        said = True
                    await self.bus.wait_events(1.0)
        except TimeoutError:
            raise UsageError(
                f"no api process published the CA certificate within {self.opts.serving_cert_wait_s:.0f} s;"
                " start one on this store (bc serve --roles api)"
            ) from None

    async def _wait_for_serving_cert(
        self, data_dir: Path, host: str, relayed: RelayedTrust, deadline: float
    ) -> serving_ctl.Issued:
        """This gateway's own key (made on a first start), its CSR in the store, and the certificate an api
        process issued there; the published CA and trust bundle with it."""
        assert self.store is not None
        cert = GatewayCert(
            self.store,
            self.bus,
            self.clock,
            self.gateway_id,
            serving.gateway_hosts(host, self.opts.advertise),
            data_dir / "gateway",
            self.claim,
        )
        cert.load_or_create_key(self.secrets)
        self.gateway_cert = cert
        said = False
        try:
            async with asyncio.timeout_at(deadline):
                while True:
                    await relayed.refresh(self.store)
                    issued = await cert.step() or cert.current
                    if issued is not None and relayed.ready:
                        break
                    if not said:
                        log.warning("event=serving-cert.waiting gateway=%s %s", self.gateway_id, serving.WAIT_LOG)
                        said = True
                    await self.bus.wait_events(1.0)
        except TimeoutError:
            raise UsageError(
                f"no api process issued gateway {self.gateway_id}'s serving certificate within"
                f" {self.opts.serving_cert_wait_s:.0f} s; start one on this store (bc serve --roles api)"
            ) from None
        log.info("event=serving-cert.issued gateway=%s not_after=%s", self.gateway_id, issued.cert.not_valid_after_utc)
        return issued

    async def _keyless_loop(self) -> None:
        """Whether the install signs, as the store says (a process without a key); the serving certificate
        renewed and swapped in."""
        assert self.store is not None and self.gateway_cert is not None
        while True:
            await self.bus.wait_events_spaced(KEYLESS_POLL_S)
            try:
                if isinstance(self.signer, KeylessSigner):
                    await self.signer.refresh(self.store)
                issued = await self.gateway_cert.step()
            except StoreError as e:
                log.warning("event=keyless.refresh-failed error=%s", e)
                continue
            if issued is not None:
                self.tls.set_identity(issued.key_pem, issued.cert_pem)
                log.info(
                    "event=serving-cert.renewed gateway=%s not_after=%s",
                    self.gateway_id,
                    issued.cert.not_valid_after_utc,
                )

    async def _api_loop(self, ca: CertificateAuthority, host: str) -> None:
        """An api process: register where it answers (gateways proxy Join and Renew there), issue serving certs."""
        assert self.store is not None
        name = self.opts.advertise[0] if self.opts.advertise and host in ("0.0.0.0", "::") else host
        self.api_address = _client_address(name, self.port)
        next_register = 0.0
        while True:
            try:
                if self.clock.monotonic() >= next_register:
                    now_ms = await self.store.now_ms()
                    async with self.store.transaction() as tx:
                        await gk_sql.register_api(tx, self.worker_id, self.api_address, now_ms, API_ENDPOINT_TTL_MS)
                    next_register = self.clock.monotonic() + API_ENDPOINT_RENEW_S
                await serving_ctl.issue_requested(self.store, self.bus, ca, self.opts.serving_cert_ttl_s)
            except StoreError as e:
                log.warning("event=api.registry-failed error=%s", e)
            await self.bus.wait_events_spaced(KEYLESS_POLL_S)

    async def _gateway_loop(self, host: str) -> None:
        """A gateway process: register where it answers, so an api process relays tunnels to its nodes here."""
        assert self.store is not None
        name = self.opts.advertise[0] if self.opts.advertise and host in ("0.0.0.0", "::") else host
        self.gateway_address = _client_address(name, self.port)
        while True:
            try:
                now_ms = await self.store.now_ms()
                async with self.store.transaction() as tx:
                    await gk_sql.register_gateway(
                        tx, self.gateway_id, self.gateway_address, now_ms, GATEWAY_ENDPOINT_TTL_MS
                    )
                self.gateway_registered.set()
            except StoreError as e:
                log.warning("event=gateway.registry-failed error=%s", e)
            await self.clock.sleep(GATEWAY_ENDPOINT_RENEW_S)

    def _process_credentials(self, ca: CertificateAuthority, host: str) -> Callable[[], grpc.ChannelCredentials]:
        """This api process's own control-plane identity (CN gateway:<id>, clientAuth), issued by its CA at start:
        what it dials a gateway with to relay a tunnel (`bc.api.tunnel_route`)."""
        key = p256_key(self.secrets)
        hosts = sorted({host, *self.opts.advertise} - {"0.0.0.0", "::", ""})
        cert = ca.issue_gateway_cert(make_csr(key, self.gateway_id), self.gateway_id, hosts, LEAF_LIFETIME_S)
        creds = channel_credentials(ca.ca_pem, keys.key_to_pem(key), keys.cert_to_pem(cert))
        return lambda: creds

    async def _api_addresses(self) -> list[str]:
        if self.opts.api:
            return list(self.opts.api)
        assert self.store is not None
        now_ms = await self.store.now_ms()
        async with self.store.transaction(write=False) as tx:
            return await gk_sql.api_addresses(tx, now_ms)

    def _api_credentials(self) -> grpc.ChannelCredentials:
        """The gateway's own certificate (CN gateway:<id>, clientAuth) to call the api with."""
        assert self.gateway_cert is not None and self.gateway_cert.current is not None
        cur = self.gateway_cert.current
        return channel_credentials(keys.cert_to_pem(self.ca_cert), cur.key_pem, cur.cert_pem)

    async def _nodes_by_state(self) -> dict[str, int]:
        assert self.store is not None
        async with self.store.transaction() as tx:
            return await nodes_sql.count_by_connectivity(tx)

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

    def _has(self, ca: CertificateAuthority | None) -> frozenset[str]:
        """What this process has beyond its roles, which decides the rest of its loops (bc.assembly.loops)."""
        # The plan decided both at start: a CA iff it holds the CA key, a certificate iff it serves one from the store.
        assert (ca is not None) == self.plan.ca and (self.gateway_cert is not None) == self.plan.serving_from_store
        return serve_has(self.plan, signing=self.signer.keys is not None, otlp=self.opts.otlp is not None)

    async def _report_loops(self) -> None:
        """Write the supervisor's states to <data-dir>/loops.json (atomic) after each change, coalesced; ends
        when `stop` says so, after the write in flight (a thread cannot be cancelled: a write finishing after
        `stop` removed the file would leave a stopped server's loops on disk)."""
        path = self.opts.data_dir / LOOPS_FILE
        while True:
            await self._loops_dirty.wait()
            self._loops_dirty.clear()
            if self._loops_closing:
                return
            data = states_json("serve", self.clock.now(), self.supervisor.states())
            try:
                await asyncio.to_thread(atomic_write, path, data, 0o644)
            except OSError as e:  # a full disk: the loops run on, only doctor's view of them is stale
                log.warning("event=loops.report-failed path=%s error=%s", path, e.strerror or e)
                continue
            self.loops_written.set()

    async def drain(self, over_s: float) -> int:
        """`bc serve drain`: spread this gateway's nodes over the others, then stop (`stopped` is set)."""
        sessions = len(self.gateway.sessions)

        async def go() -> None:
            await self.gateway.drain_spread(over_s)
            self.stopped.set()

        self._tasks.append(asyncio.create_task(go(), name="drain"))
        return sessions

    async def stop(self) -> None:
        await self.supervisor.stop()
        await cancel_and_wait(self._tasks)
        if self._loops_reporter is not None:
            self._loops_closing = True
            self._loops_dirty.set()
            await asyncio.gather(self._loops_reporter, return_exceptions=True)  # the stop goes on, whatever
            (self.opts.data_dir / LOOPS_FILE).unlink(missing_ok=True)  # no bc serve runs here now: doctor skips
        if self.relay is not None:
            await self.relay.stop()
        if self.release_server is not None:
            await self.release_server.stop()
        if self.grpc_server is not None:
            await self.grpc_server.stop(grace=1.0)
            try:
                async with asyncio.timeout(5.0):
                    await self.gateway.drain()
            except TimeoutError:
                log.warning("event=serve.drain-timeout sessions=%d", len(self.gateway.sessions))
        if self.store is not None:
            with contextlib.suppress(StoreError):
                if "gateway" in self.opts.roles and hasattr(self, "gateway"):  # a start refused before it had one
                    await self.gateway.release_lease()
            with contextlib.suppress(StoreError):
                if self.gateway_address:
                    async with self.store.transaction() as tx:
                        await gk_sql.unregister_gateway(tx, self.gateway_id)
            with contextlib.suppress(StoreError):
                if self.api_address:
                    async with self.store.transaction() as tx:
                        await gk_sql.unregister_api(tx, self.worker_id)
            with contextlib.suppress(StoreError):
                # The singletons' leases go with this process, so another bc serve takes over at once.
                async with self.store.transaction() as tx:  # the liveness sweep's too
                    for name in (JOBS_LEASE, SWEEPER_LEASE, PLACEMENT_LEASE, LIVENESS_LEASE, HEALTH_LEASE):
                        await leases.release(tx, name, self.worker_id)
            await self.store.close()
        if self.data_dir_lock is not None:
            self.data_dir_lock.release()


def _ek_roots(path: Path) -> list[x509.Certificate]:
    """The TPM EK CAs beside the CA (`bc.pki.tpm_ek`), read once at start: none when the file is absent (a TPM
    join's AK is then taken on the token's word); a file that holds no certificate stops the start."""
    try:
        pem = path.read_bytes()
    except FileNotFoundError:
        return []
    roots = load_roots(pem, str(path))
    if not roots:
        raise UsageError(f"{path} holds no certificate; remove it, or list the TPM EK CAs bc serve trusts (PEM)")
    log.info("event=tpm-ek-roots.loaded file=%s count=%d", path, len(roots))
    return roots
