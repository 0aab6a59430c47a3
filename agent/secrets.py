"""The node's side of the secret broker (docs/secrets.md): ask for a secret a section names, hold it in memory.

`SecretClient.get(name, section, generation)` returns the plaintext of the secret `name` for that
section of the spec at that generation (with `allocation_id`: bound to that allocation as well, which the
broker checks is a live allocation of this node: an instance's user data). It asks over the open
session with a `SecretRequest` bound to the section and generation, carrying the public half of a
P-256 key made for this request alone, and signed by the node key; the answer is a JWE only that key
opens (`bc.pki.secret_jwe`), so the gateway relays ciphertext. The plaintext is kept in this process's
memory, per binding, and nowhere else: not in the journal, not in a file, not in a log line (the
converger that uses it hands it to its consumer).

What the caller is told:

* the value, when held for this binding and not marked stale, or when the broker answered;
* `SecretUnavailable` when there is no session, the broker does not answer within `REQUEST_TIMEOUT_S`,
  answers a retry reason (`unavailable`, `stale-generation`, `sealed-elsewhere`), or its answer does not
  open (a gateway that tampered with it): the section stays PROGRESSING and the next pass asks again;
* `SecretRefused` with the broker's reason otherwise; the refusal is remembered for
  `REFUSAL_MEMORY_S` per binding, so a drift pass every 10 s does not ask (and the control plane does
  not publish `secret.refused`) every time, and forgotten at once when the secret is set anew.

Staleness: a `SecretRotated` notice marks every binding of that name stale and wakes the converge loop,
which asks again (a rotation re-delivers); a new session marks everything held stale, since a notice
may have been missed while disconnected.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from agent.converge.secret_port import SecretRefused, SecretUnavailable
from agent.session.outbox import Outbox
from bc.pki import secret_jwe
from bc.protocol.pb import secrets_pb2
from bc.protocol.pb.session_pb2 import NodeMessage
from bc.seams.clock import Clock

__all__ = ["SecretClient", "SecretRefused", "SecretUnavailable"]

log = logging.getLogger("agent.secrets")

REQUEST_TIMEOUT_S = 10.0
REFUSAL_MEMORY_S = 60.0
RETRY_REASONS = frozenset({"unavailable", "stale-generation", "sealed-elsewhere"})


@dataclass
class _Held:
    generation: int
    version: int
    value: bytes
    stale: bool = False


Key = tuple[str, str, str, str]  # (name, section, unit, allocation id)


class SecretClient:
    def __init__(
        self,
        node_id: str,
        outbox: Outbox,
        sign: Callable[[bytes], Awaitable[bytes]],
        server_now_ms: Callable[[], int],
        clock: Clock,
        rng: random.Random,
        wake: Callable[[], None],
    ) -> None:
        self.node_id, self.outbox, self.sign, self.server_now_ms = node_id, outbox, sign, server_now_ms
        self.clock, self.rng, self.wake = clock, rng, wake
        self._held: dict[Key, _Held] = {}
        self._refused: dict[tuple[Key, int], tuple[float, SecretRefused]] = {}
        self._pending: dict[str, asyncio.Future[secrets_pb2.SecretResponse]] = {}
        self.fetches = 0  # requests sent (tests read it)

    async def get(self, name: str, section: str, generation: int, unit: str = "", allocation_id: str = "") -> bytes:
        key = (name, section, unit, allocation_id)
        held = self._held.get(key)
        if held is not None and held.generation == generation and not held.stale:
            return held.value
        refused = self._refused.get((key, generation))
        if refused is not None and refused[0] > self.clock.monotonic():
            raise refused[1]
        value, version = await self._fetch(key, generation)
        self._held[key] = _Held(generation, version, value)
        return value

    def version(self, name: str, section: str, unit: str = "", allocation_id: str = "") -> int:
        """The version held for this binding (0: none): what the section reports, never the value."""
        held = self._held.get((name, section, unit, allocation_id))
        return held.version if held is not None else 0

    def release(self, section: str, unit: str = "") -> None:
        """The section no longer names a secret: drop what is held for it."""
        for key in [k for k in self._held if k[1] == section and k[2] == unit]:
            del self._held[key]

    # -- what the session hands in -------------------------------------------------------------------
    def on_response(self, resp: secrets_pb2.SecretResponse) -> None:
        fut = self._pending.get(resp.request_id)
        if fut is not None and not fut.done():
            fut.set_result(resp)

    def on_rotated(self, name: str, version: int) -> None:
        touched = False
        for (n, _s, _u, _a), held in self._held.items():
            if n == name and held.version != version:
                held.stale = touched = True
        for k in [k for k in self._refused if k[0][0] == name]:
            del self._refused[k]
            touched = True
        log.info("event=secret.rotated name=%s version=%d held=%s", name, version, touched)
        self.wake()

    def on_welcomed(self) -> None:
        """A new session: a rotation may have been missed while disconnected, so ask again on the next pass."""
        for held in self._held.values():
            held.stale = True
        if self._held:
            self.wake()

    # -- one request -----------------------------------------------------------------------------------
    async def _fetch(self, binding: Key, generation: int) -> tuple[bytes, int]:
        name, section, unit, allocation_id = binding
        if not self.outbox.attached:
            raise SecretUnavailable("no session to ask the broker on")
        key = secret_jwe.OneTimeKey()
        request_id = f"{self.rng.getrandbits(64):016x}"
        body = secrets_pb2.SecretRequestBody(
            request_id=request_id,
            node_id=self.node_id,
            name=name,
            binding=secrets_pb2.SecretBinding(
                section=section, generation=generation, unit=unit, allocation_id=allocation_id
            ),
            public_jwk=key.public_jwk,
            issued_at_ms=self.server_now_ms(),
        ).SerializeToString()
        sig = await self.sign(secret_jwe.request_message(body))
        fut: asyncio.Future[secrets_pb2.SecretResponse] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = fut
        try:
            await self.outbox.send(NodeMessage(secret_request=secrets_pb2.SecretRequest(body=body, node_sig=sig)))
            self.fetches += 1
            try:
                async with asyncio.timeout(REQUEST_TIMEOUT_S):
                    resp = await fut
            except TimeoutError:
                raise SecretUnavailable(f"the broker did not answer within {REQUEST_TIMEOUT_S:g} s") from None
        finally:
            self._pending.pop(request_id, None)
        if resp.refused:
            log.warning("event=secret.refused name=%s section=%s reason=%s", name, section, resp.refused)
            if resp.refused in RETRY_REASONS:
                raise SecretUnavailable(f"{resp.refused}: {resp.message}")
            refusal = SecretRefused(resp.refused, resp.message)
            self._refused[(binding, generation)] = (self.clock.monotonic() + REFUSAL_MEMORY_S, refusal)
            raise refusal
        try:
            value, version = key.open(resp.jwe, name=name, request_id=request_id)
        except secret_jwe.BadSecretAnswer as e:
            log.error("event=secret.bad-answer name=%s section=%s why=%s", name, section, e)
            raise SecretUnavailable(f"the answer did not open: {e}") from None
        log.info("event=secret.received name=%s section=%s version=%d", name, section, version)
        return value, version
