"""How a converger asks for a secret its section names (docs/secrets.md): the port and what it may raise.

The converge layer sees only this; `agent.secrets.SecretClient` (the session's side, above it) is what the
agent plugs in. `get(name, section, generation, unit, allocation_id)` returns the plaintext, or raises:

* `SecretUnavailable`: not now (no session, no answer, a retry reason): the section stays PROGRESSING;
* `SecretRefused`: the broker said no, with its reason (`out-of-scope`, `not-bound`, `unknown-secret` …).
"""

from __future__ import annotations

from typing import Protocol


class SecretUnavailable(Exception):
    """Not now: ask again on the next pass (the section stays PROGRESSING)."""


class SecretRefused(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason, self.message = reason, message


class SecretSource(Protocol):
    async def get(self, name: str, section: str, generation: int, unit: str = "", allocation_id: str = "") -> bytes: ...

    def release(self, section: str, unit: str = "") -> None: ...
