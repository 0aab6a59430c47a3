"""`boot.prepareRamdisk` and `boot.cleanUp`: set and remove a machine's boot lease (both retry-safe).

`boot.prepareRamdisk` names the machine (its MACs come from the section), the kernel and initramfs by
digest (both must be in the cache and hash right now, else `image-not-cached`), extra kernel arguments,
the ramdisk's join token, the lease's life, and more cached images (`image_sha256`: the OS image
`deploy.image` will stream from the site) served while the lease lives. The lease's command line ends with
`bc.join_token=<token> bc.site=http://<http_address>`, which the ramdisk agent reads (docs/metal.md, "The
ramdisk role"). The token is never in the result. Setting the same lease again replaces it, so a redelivered
command is harmless. `boot.cleanUp` removes the lease (and so the machine's script and its DHCP answer);
removing none is not an error.
"""

from __future__ import annotations

import re

from agent.kinds.base import InvalidPayload, KindContext, KindResult, TypedExecutor
from agent.site.bmc_kinds import UNKNOWN_MACHINE, check_machine
from agent.site.leases import Lease
from agent.site.state import SiteState, UnknownMachine
from bc.protocol import site_rules
from bc.protocol.pb import site_kinds_pb2 as pb

IMAGE_NOT_CACHED = "image-not-cached"
NO_BOOT_SERVER = "no-boot-server"
NO_MACS = "no-macs"
CMDLINE = re.compile(r"[A-Za-z0-9 ._,:/=@+-]{0,1024}")
JOIN_TOKEN = re.compile(r"[A-Za-z0-9._~-]{1,512}")
DEFAULT_LEASE_S = 3600
MAX_LEASE_S = 86400


class BootPrepareRamdisk(TypedExecutor[pb.BootPrepareRamdiskRequest]):
    name = "boot.prepareRamdisk"
    request_type = pb.BootPrepareRamdiskRequest

    def __init__(self, site: SiteState) -> None:
        self.site = site

    def validate(self, request: pb.BootPrepareRamdiskRequest) -> None:
        check_machine(request.machine)
        for field, value in (("kernel_sha256", request.kernel_sha256), ("initrd_sha256", request.initrd_sha256)):
            if not site_rules.SHA256.fullmatch(site_rules.digest(value)):
                raise InvalidPayload(f"{field} must be 64 lower-case hex digits")
        if not CMDLINE.fullmatch(request.cmdline):
            raise InvalidPayload("cmdline holds a character outside A-Z a-z 0-9 space . _ , : / = @ + -")
        if not JOIN_TOKEN.fullmatch(request.join_token):
            raise InvalidPayload("join_token is empty or not a token")
        for i, value in enumerate(request.image_sha256):
            if not site_rules.SHA256.fullmatch(site_rules.digest(value)):
                raise InvalidPayload(f"image_sha256[{i}] must be 64 lower-case hex digits")
        if not 0 <= request.lease_s <= MAX_LEASE_S:
            raise InvalidPayload(f"lease_s must be between 0 and {MAX_LEASE_S}")

    def locks(self, request: pb.BootPrepareRamdiskRequest) -> list[str]:
        return [f"boot:{request.machine}"]

    async def execute(self, ctx: KindContext, request: pb.BootPrepareRamdiskRequest) -> KindResult:
        try:
            machine = self.site.machine(request.machine)
        except UnknownMachine as e:
            return KindResult.failure(UNKNOWN_MACHINE, str(e))
        if not machine.macs:
            return KindResult.failure(NO_MACS, f"{machine.name} lists no MACs in the site section: nothing to answer")
        address = self.site.section.boot.http_address
        if not address:
            return KindResult.failure(NO_BOOT_SERVER, "the site section has no boot server (boot.http_address)")
        kernel, initrd = site_rules.digest(request.kernel_sha256), site_rules.digest(request.initrd_sha256)
        images = tuple(dict.fromkeys(site_rules.digest(s) for s in request.image_sha256))
        for sha in (kernel, initrd, *images):
            f = await self.site.cache.open_verified(sha)
            if f is None:
                return KindResult.failure(IMAGE_NOT_CACHED, f"image {sha} is not in the site's cache (or is corrupt)")
            await self.site.offload(f.close)
        life = request.lease_s or DEFAULT_LEASE_S
        expires = self.site.clock.now() + life
        cmdline = f"{request.cmdline} bc.join_token={request.join_token} bc.site=http://{address}".strip()
        lease = Lease(machine.name, tuple(machine.macs), kernel, initrd, cmdline, expires, images)
        await self.site.set_lease(lease)
        return KindResult.success(
            {
                "machine": machine.name,
                "macs": list(machine.macs),
                "kernel_sha256": kernel,
                "initrd_sha256": initrd,
                "images": [f"http://{address}/images/{sha}" for sha in images],
                "expires_at_ms": int(expires * 1000),
                "scripts": [f"http://{address}/boot/{mac}.ipxe" for mac in machine.macs],
            },
            f"{machine.name}: boot lease for {life} s",
        )


class BootCleanUp(TypedExecutor[pb.BootCleanUpRequest]):
    name = "boot.cleanUp"
    request_type = pb.BootCleanUpRequest

    def __init__(self, site: SiteState) -> None:
        self.site = site

    def validate(self, request: pb.BootCleanUpRequest) -> None:
        check_machine(request.machine)

    def locks(self, request: pb.BootCleanUpRequest) -> list[str]:
        return [f"boot:{request.machine}"]

    async def execute(self, ctx: KindContext, request: pb.BootCleanUpRequest) -> KindResult:
        removed = await self.site.remove_lease(request.machine)
        return KindResult.success(
            {"machine": request.machine, "removed": removed},
            f"{request.machine}: lease removed" if removed else f"{request.machine}: no lease",
        )
