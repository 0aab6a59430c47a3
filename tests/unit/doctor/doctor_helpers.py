"""Real data dirs for `bc doctor`: node identities issued by a real CA, journals, `bc serve` data dirs."""

from __future__ import annotations

import base64
import random
import socket
from dataclasses import dataclass
from pathlib import Path

from agent.identity import Identity
from agent.journal import Journal
from bc.pki import keys, signing
from bc.pki.ca import NODE_MAX_TTL_S, CertificateAuthority
from bc.pki.identity import make_csr
from bc.pki.secrets_source import SystemSecrets
from bc.protocol.pb import common_pb2
from bc.runtime.config import OperatorConfig
from bc.runtime.files import atomic_write
from bc.seams.clock import LoopClock
from bc.store import open_store

RNG = random.Random(1)  # ids and serials, as the one seeded Random of a process would give them
SECRETS = SystemSecrets()


@dataclass
class Cluster:
    root: Path
    clock: LoopClock
    ca: CertificateAuthority
    server: str  # a TLS listener presenting this CA, like bc serve does

    def signing_root(self, *, age_s: float = 0.0) -> bytes:
        with self.rewound(age_s):
            _, root = signing.create_root(self.clock, RNG, SECRETS)
        return keys.cert_to_pem(root)

    def rewound(self, age_s: float) -> _Rewound:
        return _Rewound(self.clock, age_s)

    def node_dir(
        self,
        node_id: str = "n1",
        *,
        name: str | None = None,
        ttl_s: int = NODE_MAX_TTL_S,
        age_s: float = 0.0,
        roots: list[bytes] | None = None,
        server: str | None = None,
        time_mark_ms: int = 0,
    ) -> Path:
        """What `bc join` leaves: identity.json, node.key (0600), node.crt, ca.crt; the cert issued `age_s` ago."""
        d = self.root / (name or f"node-{node_id}")
        key = keys.generate_key()
        with self.rewound(age_s):
            cert = self.ca.issue_node_cert(make_csr(key, "pending"), node_id, "node", 1, ttl_s=ttl_s)
        bundle = common_pb2.TrustBundle(
            ca_pem=self.ca.ca_pem, command_signing_roots=[self.signing_root()] if roots is None else roots
        )
        keys.write_private_key(d / "node.key", key)
        atomic_write(d / "node.crt", keys.cert_to_pem(cert))
        atomic_write(d / "ca.crt", self.ca.ca_pem)
        Identity(
            node_id=node_id,
            role="node",
            server=server or self.server,
            identity_generation=1,
            ca_fingerprint=self.ca.fingerprint,
            server_time_mark_ms=time_mark_ms,
            trust_bundle_b64=base64.b64encode(bundle.SerializeToString()).decode(),
        ).save(d)
        return d

    def server_dir(self, name: str = "server", *, command_signing: bool = True) -> Path:
        """What the first start of `bc serve` leaves, store aside (see `make_store`)."""
        d = self.root / name
        pki = d / "pki"
        ca, _ = CertificateAuthority.load_or_create(pki, self.clock, RNG, SECRETS)
        if command_signing:
            signing.SigningKeys.create(pki, self.clock, RNG, SECRETS)
        op_key = keys.generate_key()
        OperatorConfig.write(
            d / "operator",
            server="127.0.0.1:7443",
            ca_pem=ca.ca_pem,
            cert_pem=keys.cert_to_pem(ca.issue_operator_cert("local", op_key)),
            key_pem=keys.key_to_pem(op_key),
            data_dir=d,
        )
        return d


class _Rewound:
    """Run a block with the clock `age_s` in the past: certificates issued inside are that old."""

    def __init__(self, clock: LoopClock, age_s: float) -> None:
        self.clock, self.age_s = clock, age_s

    def __enter__(self) -> None:
        self.clock.step(-self.age_s)

    def __exit__(self, *exc: object) -> None:
        self.clock.step(self.age_s)


async def make_journal(data_dir: Path, node_id: str, meta: dict[str, str] | None = None) -> Path:
    """A journal as `bc node` leaves it, with extra meta (what the agent records about the clock)."""
    path = data_dir / "journal.db"
    j = await Journal.open(path, node_id)
    try:
        for k, v in (meta or {}).items():
            await j.set_meta(k, v)
    finally:
        await j.close()
    return path


async def make_store(data_dir: Path, clock: LoopClock) -> None:
    store = await open_store(str(data_dir / "bc.db"), clock)
    await store.close()


def closed_port() -> str:
    """An address where nothing listens: connecting is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"
