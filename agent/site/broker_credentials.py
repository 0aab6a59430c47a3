"""BMC credentials from the secret broker: the `site` section's `credentials_secret_ref` (docs/metal.md).

The secret holds the credentials file's JSON (agent.site.credentials). It is asked for through the agent's
secret port (agent.converge.secret_port), bound to the `site` section and its generation, and held in the
agent's memory only (the port's, per binding): never on disk, in the journal or a log line. Every `bmc.*`
command asks the port again, which answers from memory unless a rotation (`SecretRotated`) or a new session
marked it stale: so a rotated secret is what the next command after its delivery drives the BMC with.
"""

from __future__ import annotations

from typing import Any

from agent.converge.secret_port import SecretRefused, SecretSource, SecretUnavailable
from agent.site import credentials
from agent.site.credentials import Credential, CredentialsError

SECTION = "site"


def where(ref: str) -> str:
    return f"the BMC credentials secret {ref!r}"


class BrokerCredentials:
    def __init__(self, source: SecretSource) -> None:
        self.source = source

    async def document(self, ref: str, generation: int) -> dict[str, Any]:
        """The secret's document; SecretUnavailable, SecretRefused, or CredentialsError (not that shape)."""
        raw = await self.source.get(ref, SECTION, generation)
        return credentials.parse(raw, where(ref))

    async def load(self, ref: str, generation: int, machine: str) -> Credential:
        """The machine's credential from the secret; only CredentialsError, one sentence, never the value."""
        try:
            doc = await self.document(ref, generation)
        except SecretUnavailable as e:
            raise CredentialsError(f"{where(ref)} is not available from the broker yet ({e})") from None
        except SecretRefused as e:
            raise CredentialsError(f"{where(ref)} was refused by the broker ({e})") from None
        return credentials.pick(doc, machine, where(ref))

    def release(self) -> None:
        """The section no longer names a secret: forget what is held."""
        self.source.release(SECTION)
