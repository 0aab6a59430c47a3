"""The `site` section's converger: the section checked and held, the image cache warmed, the boot server run.

One pass:

1. the section is checked again with the control plane's rules (`bc.protocol.site_rules`); a bad one is
   FAILED (terminal) and nothing of it is used;
2. it becomes the section the kinds read (machines, credentials file, proxy targets);
3. every `cache_images` entry is started warming (`agent.site.image_cache`);
4. the boot server follows `boot` (HTTP server, dnsmasq with the live leases' MACs), or stops without it.

The result: FAILED (terminal) naming every image whose bytes did not match its digest; PROGRESSING while
any image warms or waits to be pulled again (a failed download), or the boot server would not start;
CONVERGED when every image is cached and the boot server runs. A download's end wakes the converge loop.
"""

from __future__ import annotations

import logging

from google.protobuf.message import Message

from agent.converge.run import CONVERGED, FAILED, PROGRESSING, SectionResult
from agent.site.dnsmasq import BootServerError
from agent.site.image_cache import MISMATCH, READY
from agent.site.state import SiteState
from bc.protocol import site_rules
from bc.protocol.pb import spec_pb2

log = logging.getLogger(__name__)

REASON_INVALID = "SiteSectionInvalid"
REASON_DIGEST = "ImageDigestMismatch"
REASON_WARMING = "ImagesWarming"
REASON_BOOT = "BootServerFailed"


class SiteConverger:
    section = "site"

    def __init__(self, site: SiteState) -> None:
        self.site = site

    async def converge(self, desired: Message, generation: int) -> SectionResult:
        assert isinstance(desired, spec_pb2.SiteSection)
        try:
            site_rules.check_section(desired)
        except site_rules.SiteRuleError as e:
            return SectionResult(FAILED, REASON_INVALID, f"the site section's {e}", terminal=True)
        self.site.section = desired
        wanted = [(img.url, site_rules.digest(img.sha256)) for img in desired.cache_images]
        states = self.site.cache.warm(wanted, generation)
        try:
            await self.site.sync_boot()
        except (BootServerError, OSError) as e:
            log.warning("event=site.boot.failed error=%r", str(e))
            return SectionResult(PROGRESSING, REASON_BOOT, str(e)[:300])
        bad = [s for s in states if s.state == MISMATCH]
        if bad:
            return SectionResult(FAILED, REASON_DIGEST, "; ".join(s.message for s in bad)[:1000], terminal=True)
        waiting = [s for s in states if s.state != READY]
        if waiting:
            detail = "; ".join(s.message for s in waiting if s.message)
            text = f"{len(states) - len(waiting)} of {len(states)} images cached" + (f" ({detail})" if detail else "")
            return SectionResult(PROGRESSING, REASON_WARMING, text[:1000])
        return SectionResult(CONVERGED, message=f"{len(states)} images cached")
