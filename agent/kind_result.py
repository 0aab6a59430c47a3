"""A command's outcome, as a kind, the self-update controller and the `daemon` section report it.

Below the kinds, the convergers and the upgrade controller, so each can report one without importing
another (docs/design.md, "The agent's layers"); `agent.kinds.base` gives it to the kinds under its old name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bc.protocol.canonical import canonical_json


@dataclass(frozen=True)
class KindResult:
    """A command's outcome. `result` must be JSON-able: the dispatcher stores it as canonical JSON bytes."""

    ok: bool
    reason: str = ""
    """The error code when not ok: invalid-payload, gpu-busy, dcgm-not-installed, internal or a kind's own."""
    message: str = ""
    result: dict[str, Any] = field(default_factory=dict)
    encoded: bytes | None = field(default=None, compare=False)
    """`result` as the dispatcher stores and sends it (canonical JSON, UTF-8), when the kind has it at hand;
    None to let the dispatcher encode `result`. inventory.refresh keeps its per inventory: encoding an
    inventory (protobuf JSON, then canonical JSON) was about 80 µs a command, the same bytes every time."""

    def result_bytes(self) -> bytes:
        """The result as the dispatcher stores and sends it: canonical JSON."""
        return self.encoded if self.encoded is not None else canonical_json(self.result).encode()

    @classmethod
    def success(cls, result: dict[str, Any] | None = None, message: str = "") -> KindResult:
        return cls(ok=True, message=message, result=result or {})

    @classmethod
    def failure(cls, reason: str, message: str, result: dict[str, Any] | None = None) -> KindResult:
        return cls(ok=False, reason=reason, message=message, result=result or {})
