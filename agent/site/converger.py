"""The `site` section's converger: the section checked and held, the image cache warmed, the boot server run.

One pass:

1. the section is checked again with the control plane's rules (`bc.protocol.site_rules`); a bad one is
   FAILED (terminal) and nothing of it is used;
2. it becomes the section the kinds read (machines, credentials file, proxy targets);
   with `credentials_secret_ref` the secret is asked for (agent.site.broker_credentials), bound to this
   section and generation: the broker unavailable is PROGRESSING `SecretUnavailable` (and the kinds fail
   `bmc-credentials` until it answers), a refusal FAILED `SecretRefused` with the broker's reason, a value
   that is not the credentials JSON FAILED `BadCredentials` (never quoting it); an agent without a broker
   client answers UNSUPPORTED;
3. every `cache_images` entry is started warming (`agent.site.image_cache`);
4. the boot server follows `boot` (HTTP server, dnsmasq with the live leases' MACs), or stops without it.

The result: FAILED (terminal) naming every image whose bytes did not match its digest; PROGRESSING while
any image warms or waits to be pulled again (a failed download), or the boot server would not start;
CONVERGED when every image is cached and the boot server runs. A download's end wakes the converge loop.
"""

from __future__ import annotations

import logging

from google.protobuf.message import Message

from agent.converge.run import CONVERGED, FAILED, PROGRESSING, UNSUPPORTED, SectionResult
from agent.converge.secret_port import SecretRefused, SecretUnavailable
from agent.site.credentials import CredentialsError
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
REASON_SECRET_UNAVAILABLE = "SecretUnavailable"
REASON_SECRET_REFUSED = "SecretRefused"
REASON_BAD_CREDENTIALS = "BadCredentials"
REASON_FIELD_UNSUPPORTED = "FieldUnsupported"


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
        self.site.section, self.site.generation = desired, generation
        creds = await self._credentials(desired.credentials_secret_ref, generation)
        wanted = [(img.url, site_rules.digest(img.sha256)) for img in desired.cache_images]
        states = self.site.cache.warm(wanted, generation)
        try:
            await self.site.sync_boot()
        except (BootServerError, OSError) as e:
            log.warning("event=site.boot.failed error=%r", str(e))
            if creds is not None and creds.state != PROGRESSING:
                return creds
            return SectionResult(PROGRESSING, REASON_BOOT, str(e)[:300])
        if creds is not None and creds.state != PROGRESSING:
            return creds
        bad = [s for s in states if s.state == MISMATCH]
        if bad:
            return SectionResult(FAILED, REASON_DIGEST, "; ".join(s.message for s in bad)[:1000], terminal=True)
        if creds is not None:
            return creds
        waiting = [s for s in states if s.state != READY]
        if waiting:
            detail = "; ".join(s.message for s in waiting if s.message)
            text = f"{len(states) - len(waiting)} of {len(states)} images cached" + (f" ({detail})" if detail else "")
            return SectionResult(PROGRESSING, REASON_WARMING, text[:1000])
        return SectionResult(CONVERGED, message=f"{len(states)} images cached")

    async def _credentials(self, ref: str, generation: int) -> SectionResult | None:
        """None when the credentials need nothing more (a file, or the secret delivered), else what to report."""
        broker = self.site.broker
        if not ref:
            if broker is not None:
                broker.release()
            return None
        if broker is None:
            field = spec_pb2.SiteSection.DESCRIPTOR.fields_by_name["credentials_secret_ref"].number
            return SectionResult(
                UNSUPPORTED,
                REASON_FIELD_UNSUPPORTED,
                f"site.credentials_secret_ref (field {field}) needs the secret broker; no BMC can be driven",
                terminal=True,
            )
        try:
            await broker.document(ref, generation)
        except SecretUnavailable as e:
            return SectionResult(PROGRESSING, REASON_SECRET_UNAVAILABLE, f"secret {ref!r}: {e}"[:1000])
        except SecretRefused as e:
            return SectionResult(
                FAILED, REASON_SECRET_REFUSED, f"secret {ref!r} refused: {e}; no BMC is driven"[:1000], terminal=True
            )
        except CredentialsError as e:
            return SectionResult(FAILED, REASON_BAD_CREDENTIALS, str(e)[:1000], terminal=True)
        return None
