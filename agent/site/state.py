"""What the site role holds: the section it was last given, its leases, its cache, its boot server, its BMCs.

One `SiteState` per site agent, built by `agent.app` (or a test) with everything passed in: the data dir,
the clock, the offload, how a BMC is opened (`agent.site.redfish.OpenBmc`), how a name is resolved, and the
site's local `bmc_networks`. The converger writes `section` and starts the boot server; the kinds read the
section, drive BMCs through `bmc()`, and set leases through `set_lease()` / `remove_lease()`.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agent.converge.secret_port import SecretSource
from agent.offload import Offload
from agent.site import credentials, leases
from agent.site.bmc_hosts import BmcHosts
from agent.site.boot_config import leased_macs
from agent.site.boot_http import BootHttp
from agent.site.broker_credentials import BrokerCredentials
from agent.site.dnsmasq import Dnsmasq
from agent.site.image_cache import ImageCache
from agent.site.redfish import Bmc, OpenBmc, Timeouts, call, open_redfish
from bc.pki.secrets_source import Secrets, SystemSecrets
from bc.protocol import site_rules
from bc.protocol.pb import spec_pb2
from bc.seams.clock import Clock

log = logging.getLogger(__name__)

Resolve = Callable[[str], Awaitable[list[str]]]


async def resolve_host(host: str) -> list[str]:
    """Every address `host` resolves to (an IP literal: itself); empty when it does not resolve."""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return []
    return sorted({str(info[4][0]) for info in infos})


class UnknownMachine(Exception):
    pass


@dataclass
class SiteOptions:
    bmc_networks: Sequence[ipaddress.IPv4Network | ipaddress.IPv6Network] = ()
    """`bc node --site-bmc-network CIDR`: addresses site.httpProxy never reaches, whatever the spec says."""
    timeouts: Timeouts = field(default_factory=Timeouts)
    run_dnsmasq: bool = True
    """False: the boot server's HTTP half only (a test without an interface to answer DHCP on)."""
    dnsmasq_binary: str = "dnsmasq"
    boot_dir: Path | None = None
    """`bc node --site-boot-dir`: dnsmasq's config, TFTP root and leased MACs; it and its parents must be
    readable by dnsmasq's unprivileged user. Default `<data-dir>/site/boot`."""


class SiteState:
    def __init__(
        self,
        data_dir: Path,
        clock: Clock,
        offload: Offload,
        options: SiteOptions | None = None,
        open_bmc: OpenBmc | None = None,
        resolve: Resolve = resolve_host,
        wake: Callable[[], None] = lambda: None,
        secrets: Secrets | None = None,
        secret_source: SecretSource | None = None,
    ) -> None:
        self.options = options or SiteOptions()
        self.secrets: Secrets = secrets or SystemSecrets()
        """Where bmc.rotate's new passwords come from (the OS's entropy in production)."""
        self.broker = BrokerCredentials(secret_source) if secret_source is not None else None
        """Where `credentials_secret_ref` is read from (the agent's secret client); None: no broker."""
        self.generation = 0
        """The generation `section` came with (what a secret request is bound to)."""
        self.site_dir = data_dir / "site"
        self.clock, self.offload = clock, offload
        self.open_bmc = open_bmc or open_redfish(self.options.timeouts)
        self.resolve = resolve
        self.section = spec_pb2.SiteSection()
        self.bmc_hosts = BmcHosts(data_dir)
        self.lease_file = leases.LeaseFile(self.site_dir)
        self.leases: dict[str, leases.Lease] | None = None
        self.cache = ImageCache(self.site_dir / "images", offload, on_change=wake)
        self.http = BootHttp(self.cache, self.live_by_mac, lambda: self.section.boot.http_address)
        self._http_address = ""
        boot_dir = self.options.boot_dir or self.site_dir / "boot"
        self.dnsmasq = Dnsmasq(boot_dir, offload, self.options.dnsmasq_binary)
        self.lock = asyncio.Lock()
        """Held while the leases or the boot server change (kinds and the converger both change them)."""

    # -- machines and BMCs ---------------------------------------------------------------------------
    def machine(self, name: str) -> spec_pb2.SiteMachine:
        for m in self.section.machines:
            if m.name == name:
                return m
        raise UnknownMachine(f"{name!r} is not a machine of this site's section")

    async def bmc(self, machine: spec_pb2.SiteMachine) -> Bmc:
        """An open BMC for the machine: its host remembered first, then the credentials read (the 0600 file,
        or the broker's secret)."""
        ref, path = self.section.credentials_secret_ref, self.section.credentials_file
        if not ref and not path:
            raise credentials.CredentialsError("the site section names no credentials_file or credentials_secret_ref")
        if ref and self.broker is None:
            raise credentials.CredentialsError("credentials_secret_ref needs the secret broker; this agent has none")
        await self.offload(self.bmc_hosts.remember, site_rules.bmc_host(machine.bmc_url))
        if ref:
            assert self.broker is not None
            cred = await self.broker.load(ref, self.generation, machine.name)
        else:
            cred = await self.offload(credentials.load, Path(path), machine.name)
        # Opening one reads the service root: the same bounds and failure reasons as every later call.
        return await call(
            self.offload, self.options.timeouts, lambda: self.open_bmc(machine.bmc_url, machine.system_id, cred)
        )

    async def bmc_addresses(self) -> list[str]:
        """What every BMC host (driven or listed) resolves to, for site.httpProxy's check."""
        hosts = await self.offload(self.bmc_hosts.hosts)
        hosts |= {site_rules.bmc_host(m.bmc_url) for m in self.section.machines}
        out: set[str] = set()
        for h in hosts:
            out.update(await self.resolve(h))
        return sorted(out)

    # -- leases and the boot server -----------------------------------------------------------------
    async def load_leases(self) -> dict[str, leases.Lease]:
        if self.leases is None:
            self.leases = await self.offload(self.lease_file.load)
        return self.leases

    def live_by_mac(self) -> dict[str, leases.Lease]:
        return leases.by_mac(self.leases or {}, self.clock.now())

    async def set_lease(self, lease: leases.Lease) -> None:
        async with self.lock:
            current = dict(await self.load_leases())
            current[lease.machine] = lease
            await self.offload(self.lease_file.store, current)
            self.leases = current
            await self._sync_boot()

    async def remove_lease(self, machine: str) -> bool:
        async with self.lock:
            current = dict(await self.load_leases())
            had = current.pop(machine, None) is not None
            await self.offload(self.lease_file.store, current)
            self.leases = current
            await self._sync_boot()
            return had

    async def sync_boot(self) -> None:
        async with self.lock:
            await self.load_leases()
            await self._sync_boot()

    async def _sync_boot(self) -> None:
        boot = self.section.boot
        if not boot.http_address:
            await self.stop_boot()
            return
        if boot.http_address != self._http_address:
            await self.http.stop()
            host, port = site_rules.parse_http_address(boot.http_address)
            await self.http.start(host, port)
            self._http_address = boot.http_address
            log.info("event=site.http.started address=%s", boot.http_address)
        if self.options.run_dnsmasq:
            await self.dnsmasq.apply(boot, leased_macs(self.live_by_mac()))

    async def stop_boot(self) -> None:
        await self.http.stop()
        self._http_address = ""
        await self.dnsmasq.stop()

    async def close(self) -> None:
        await self.stop_boot()
        await self.cache.close()
