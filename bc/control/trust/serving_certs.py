"""Serving certificates through the store: a keyless gateway asks (`GatewayCert`), an api process issues
(`issue_requested`). The rules of when to ask are `bc.pki.serving`'s."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from bc.control.base.bus import Bus
from bc.control.base.events import publish
from bc.errors import BcError, UsageError
from bc.pki import keys, serving
from bc.pki.ca import CertificateAuthority
from bc.pki.secrets_source import Secrets, p256_key
from bc.seams.clock import Clock
from bc.store import Store
from bc.store import gateway_keys as gk_sql
from bc.store.leases import Claim

log = logging.getLogger("bc.serving_certs")

KEY_FILE = "serving.key"


async def issue_requested(
    store: Store, bus: Bus | None, ca: CertificateAuthority, lifetime_s: float = serving.SERVING_CERT_TTL_S
) -> list[str]:
    """Issue every waiting request (api side); a request that cannot be honoured is answered with no
    certificate (`cert_pem` empty) and `pki.serving-cert.refused`. Returns the gateways answered."""
    async with store.transaction(write=False) as tx:
        rows = await gk_sql.serving_requests(tx)
    done: list[str] = []
    for r in rows:
        gateway_id, requested = str(r["gateway_id"]), int(r["requested_at_ms"])
        try:
            csr = x509.load_pem_x509_csr(str(r["csr_pem"]).encode())
            hosts = serving.decode_hosts(str(r["hosts"]))
            cert = ca.issue_gateway_cert(csr, gateway_id, hosts, lifetime_s)
            pem, not_after_ms = keys.cert_to_pem(cert).decode(), int(cert.not_valid_after_utc.timestamp() * 1000)
            event, data = "pki.serving-cert.issued", {"hosts": hosts, "not_after_ms": not_after_ms}
        except (ValueError, BcError) as e:
            why = e.message if isinstance(e, BcError) else "the certificate request does not parse"
            pem, not_after_ms = "", 0
            event, data = "pki.serving-cert.refused", {"why": why}
        now_ms = await store.now_ms()
        async with store.transaction() as tx:
            if await gk_sql.issue_serving_cert(tx, gateway_id, requested, pem, not_after_ms, now_ms):
                await publish(tx, bus, event, gateway_id, data, now_ms)
                done.append(gateway_id)
        log.info("event=%s gateway=%s", event, gateway_id)
    return done


@dataclass(frozen=True)
class Issued:
    key_pem: bytes
    cert_pem: bytes
    cert: x509.Certificate


class GatewayCert:
    """A keyless gateway's serving certificate: its own key (0600 in `dir`), asked for and read from the store."""

    def __init__(
        self,
        store: Store,
        bus: Bus,
        clock: Clock,
        gateway_id: str,
        hosts: list[str],
        dir: Path,
        claim: Claim | None = None,
    ) -> None:
        self.store, self.bus, self.clock, self.gateway_id, self.hosts = store, bus, clock, gateway_id, hosts
        self.dir = dir
        # This process's hold on the gateway's lease: a request is written only while it holds, so a second
        # process under the same gateway id cannot ask for a certificate for its own key (a re-issue loop).
        self.claim = claim
        self._fenced_said = False
        self.key: ec.EllipticCurvePrivateKey | None = None
        self.current: Issued | None = None

    def load_or_create_key(self, secrets: Secrets) -> None:
        path = self.dir / KEY_FILE
        if path.exists():
            self.key = keys.load_key_pem(path.read_bytes())
            return
        self.key = p256_key(secrets)
        keys.write_private_key(path, self.key)

    async def step(self) -> Issued | None:
        """Ask again when the rules say so; the certificate to serve with when a new one was issued, else None."""
        key = self.key
        assert key is not None, "load_or_create_key first"
        now = self.clock.now()
        async with self.store.transaction(write=False) as tx:
            row = await gk_sql.serving_cert(tx, self.gateway_id)
        stored: x509.Certificate | None = None
        if row is not None and row["cert_pem"]:
            stored = keys.load_cert_pem(str(row["cert_pem"]).encode())
        fresh: Issued | None = None
        new = stored is not None and (self.current is None or self.current.cert != stored)
        if stored is not None and new and serving.usable(stored, key.public_key(), now):
            fresh = Issued(keys.key_to_pem(key), keys.cert_to_pem(stored), stored)
            self.current = fresh
        stored_hosts = serving.decode_hosts(str(row["hosts"])) if row is not None else []
        waiting = row is not None and (
            row["issued_at_ms"] is None or int(row["issued_at_ms"]) < int(row["requested_at_ms"])
        )
        if row is not None and not waiting and not row["cert_pem"] and sorted(stored_hosts) == sorted(self.hosts):
            raise UsageError(
                f"an api process refused the serving certificate of gateway {self.gateway_id}"
                " (see its pki.serving-cert.refused event)"
            )
        if waiting and sorted(stored_hosts) == sorted(self.hosts):
            return fresh
        if serving.needs_request(stored, key.public_key(), self.hosts, stored_hosts, now):
            csr = serving.make_csr(key, self.gateway_id).public_bytes(serialization.Encoding.PEM).decode()
            now_ms = await self.store.now_ms()
            async with self.store.transaction() as tx:
                asked = await gk_sql.request_serving_cert(
                    tx, self.gateway_id, serving.encode_hosts(self.hosts), csr, now_ms, self.claim
                )
                if asked:
                    data = {"hosts": self.hosts}
                    await publish(tx, self.bus, "pki.serving-cert.requested", self.gateway_id, data, now_ms)
            if asked:
                self._fenced_said = False
                log.info("event=serving-cert.requested gateway=%s hosts=%s", self.gateway_id, ",".join(self.hosts))
            elif not self._fenced_said:
                self._fenced_said = True
                log.warning(
                    "event=serving-cert.request-fenced gateway=%s why='this process does not hold the lease'",
                    self.gateway_id,
                )
        return fresh
