"""The site role's parts as the agent wires them: its executors by kind, over one SiteState."""

from __future__ import annotations

from agent.kinds.base import KindExecutor
from agent.site.bmc_kinds import bmc_executors
from agent.site.boot_kinds import BootCleanUp, BootPrepareRamdisk
from agent.site.proxy_kind import SiteHttpProxy
from agent.site.state import SiteState


def site_executors(site: SiteState) -> dict[str, KindExecutor]:
    """Every kind only a site agent runs (bc.protocol.kinds' `site` role), by name."""
    executors: list[KindExecutor] = [
        *bmc_executors(site),
        BootPrepareRamdisk(site),
        BootCleanUp(site),
        SiteHttpProxy(site),
    ]
    return {e.name: e for e in executors}
