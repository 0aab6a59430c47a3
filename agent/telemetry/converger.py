"""The `telemetry` section: where the agent's metrics go (bc.otel.config checks it; the loop exports).

An empty section stops the export. A section whose endpoint is not a URL (or
whose protocol or interval is wrong) FAILS terminally with reason
`BadEndpoint` and the sentence why, and the export stops: the agent never
keeps exporting to a destination the spec no longer names. Headers come
with the secret broker (a later issue): a `headers_secret_ref` makes the
section UNSUPPORTED with its field number, while the rest is applied.
"""

from __future__ import annotations

from google.protobuf.message import Message

from agent.converge.run import CONVERGED, FAILED, UNSUPPORTED, SectionResult
from agent.telemetry.loop import TelemetryLoop
from bc.otel.config import BadOtlpConfig, parse
from bc.protocol.pb import spec_pb2

REASON_BAD_ENDPOINT = "BadEndpoint"
REASON_FIELD_UNSUPPORTED = "FieldUnsupported"


class TelemetryConverger:
    section = "telemetry"

    def __init__(self, loop: TelemetryLoop) -> None:
        self.loop = loop

    async def converge(self, desired: Message, generation: int) -> SectionResult:
        assert isinstance(desired, spec_pb2.TelemetrySection)
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
        self.loop.configure(cfg)
        if desired.headers_secret_ref:
            field = spec_pb2.TelemetrySection.DESCRIPTOR.fields_by_name["headers_secret_ref"].number
            return SectionResult(
                UNSUPPORTED,
                reason=REASON_FIELD_UNSUPPORTED,
                message=f"telemetry.headers_secret_ref (field {field}) needs the secret broker; exporting without",
                terminal=True,
            )
        return SectionResult(CONVERGED)
