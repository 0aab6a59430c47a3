"""The `telemetry` section: where the agent's metrics go (bc.otel.config checks it; the loop exports).

An empty section stops the export. A section whose endpoint is not a URL (or
whose protocol or interval is wrong) FAILS terminally with reason
`BadEndpoint` and the sentence why, and the export stops: the agent never
keeps exporting to a destination the spec no longer names.

`headers_secret_ref` names a secret (docs/secrets.md) whose value is the
exporter's headers (`bc.otel.config.parse_headers`: `key=value` entries). The
converger asks the broker for it (agent.secrets), bound to this section and
generation, and exports with those headers:

* broker unavailable (no session, no answer, a retry reason): PROGRESSING
  `SecretUnavailable`; the export keeps the headers it already had for the
  same reference, and without any does not run (a collector that wants them
  would refuse it anyway);
* refused (out of scope, not named, unknown): FAILED `SecretRefused` with the
  broker's reason, and no export, until the secret or the spec changes;
* a value that is not headers: FAILED `BadHeaders` (the message never quotes it).

An agent built without a broker client (the simulator) keeps the old rule:
the field is UNSUPPORTED and the rest is applied.
"""

from __future__ import annotations

import dataclasses

from google.protobuf.message import Message

from agent.converge.run import CONVERGED, FAILED, PROGRESSING, UNSUPPORTED, SectionResult
from agent.converge.secret_port import SecretRefused, SecretSource, SecretUnavailable
from agent.telemetry.loop import TelemetryLoop
from bc.otel.config import BadOtlpConfig, OtlpConfig, parse, parse_headers
from bc.protocol.pb import spec_pb2

REASON_BAD_ENDPOINT = "BadEndpoint"
REASON_FIELD_UNSUPPORTED = "FieldUnsupported"
REASON_SECRET_UNAVAILABLE = "SecretUnavailable"
REASON_SECRET_REFUSED = "SecretRefused"
REASON_BAD_HEADERS = "BadHeaders"
SECTION = "telemetry"


class TelemetryConverger:
    section = SECTION

    def __init__(self, loop: TelemetryLoop, secrets: SecretSource | None = None) -> None:
        self.loop = loop
        self.secrets = secrets
        self._headers: tuple[str, tuple[tuple[str, str], ...]] | None = None  # (ref, headers) last exported with

    async def converge(self, desired: Message, generation: int) -> SectionResult:
        assert isinstance(desired, spec_pb2.TelemetrySection)
        ref = desired.headers_secret_ref
        if not ref:
            self._forget()
        if not desired.otlp_endpoint:
            self.loop.configure(None)
            return SectionResult(CONVERGED)
        try:
            cfg = parse(
                desired.otlp_endpoint,
                desired.protocol,
                desired.export_interval_s,
                dict(desired.resource_attributes),
            )
        except BadOtlpConfig as e:
            self.loop.configure(None)
            return SectionResult(FAILED, reason=REASON_BAD_ENDPOINT, message=str(e), terminal=True)
        if not ref:
            self.loop.configure(cfg)
            return SectionResult(CONVERGED)
        if self.secrets is None:
            self.loop.configure(cfg)
            field = spec_pb2.TelemetrySection.DESCRIPTOR.fields_by_name["headers_secret_ref"].number
            return SectionResult(
                UNSUPPORTED,
                reason=REASON_FIELD_UNSUPPORTED,
                message=f"telemetry.headers_secret_ref (field {field}) needs the secret broker; exporting without",
                terminal=True,
            )
        return await self._with_headers(cfg, ref, generation)

    async def _with_headers(self, cfg: OtlpConfig, ref: str, generation: int) -> SectionResult:
        assert self.secrets is not None
        try:
            raw = await self.secrets.get(ref, SECTION, generation)
        except SecretUnavailable as e:
            kept = self._headers[1] if self._headers is not None and self._headers[0] == ref else None
            self.loop.configure(dataclasses.replace(cfg, headers=kept) if kept is not None else None)
            still = "exporting with the headers held" if kept is not None else "not exporting until it answers"
            return SectionResult(PROGRESSING, reason=REASON_SECRET_UNAVAILABLE, message=f"secret {ref!r}: {e}; {still}")
        except SecretRefused as e:
            self._forget()
            self.loop.configure(None)
            return SectionResult(
                FAILED,
                reason=REASON_SECRET_REFUSED,
                message=f"secret {ref!r} refused: {e}; not exporting",
                terminal=True,
            )
        try:
            headers = parse_headers(raw.decode("utf-8"))
        except (UnicodeDecodeError, BadOtlpConfig) as e:
            self._forget()
            self.loop.configure(None)
            why = "it is not UTF-8" if isinstance(e, UnicodeDecodeError) else str(e)
            return SectionResult(
                FAILED, reason=REASON_BAD_HEADERS, message=f"secret {ref!r}: {why}; not exporting", terminal=True
            )
        self._headers = (ref, headers)
        self.loop.configure(dataclasses.replace(cfg, headers=headers))
        return SectionResult(CONVERGED)

    def _forget(self) -> None:
        self._headers = None
        if self.secrets is not None:
            self.secrets.release(SECTION)
