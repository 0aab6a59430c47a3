"""The names of a NodeSpec's sections, apart from `bc.protocol.canonical`'s JSON machinery.

The CLI names them in its options (`bc spec set NODE SECTION`) at import, and a
one-shot call should not pay for protobuf's `json_format` to know seven words.
"""

from __future__ import annotations

SECTIONS: tuple[str, ...] = ("host", "devices", "instances", "access", "telemetry", "daemon", "site")
"""The NodeSpec sections, in the order the agent converges them."""
