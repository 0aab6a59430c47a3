"""Keys follow roles: what a `bc serve --roles …` process reads, and which of its flags its roles give a meaning to.

One rule for every subset of `api,gateway,worker` (docs/fleet.md, "Roles and keys"):

    role in the process     keys it reads                          what it does with them
    api                     the CA key (created at a first start);  issues certificates, signs join answers,
                            the signing keys, the root key while    signs intent, rotates and endorses
                            it is on the host
    worker (without api)    the worker key alone:                   signs what its loops write and the specs
                            pki/signing/{worker.key,worker.crt,     a gateway left pending
                            root.crt}, copied from an api process
    gateway (without api)   its own serving key                     serves Session; forwards Join and Renew to
                            (gateway/serving.key), its certificate  an api process found in the store (or --api)
                            issued by an api process into the store

A process's keys are the union over its roles: `gateway,worker` holds the worker key and its serving key,
`gateway` alone nothing that signs. Without the api role no process reads or creates the CA key or the
root key, whatever its data dir holds: a CA or root made there would sign what no node trusts. The api role
brings the CA and the signing keys with it whatever else runs beside it, so a lab's one process (all
roles) is unchanged.

A flag that only a listening process uses (`--listen`, `--advertise`, `--release-listen`), one that only a
forwarding gateway uses (`--api`), and one that only the CA's holder decides (`--command-signing`) are
refused, in one sentence, when given to a process whose roles would ignore it: an ignored `--listen` on a
worker-only process looked as if it served something.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from bc.errors import UsageError

ROLES = frozenset({"api", "gateway", "worker"})
"""api: the Admin and Join services; gateway: node sessions (Session) and the gateway lease; worker: the
singleton loops (liveness, the command sweeper, the placement pass, the jobs scheduler)."""


def parse_roles(text: str) -> frozenset[str]:
    """`--roles api,gateway,worker` (any non-empty subset, in any order)."""
    roles = frozenset(r.strip() for r in text.split(",") if r.strip())
    unknown = roles - ROLES
    if unknown or not roles:
        raise UsageError(f"--roles takes api, gateway and worker, comma-separated, not {text!r}")
    return roles


@dataclass(frozen=True)
class KeyPlan:
    """What a process with these roles holds and serves (pure: decided from the roles alone)."""

    roles: frozenset[str]

    @property
    def ca(self) -> bool:
        """The CA key and the signing keys from the data dir, created on a first start (root while on the host)."""
        return "api" in self.roles

    @property
    def worker_key(self) -> bool:
        """The worker key alone, from `pki/signing/`; the CA certificate from the store."""
        return "worker" in self.roles and not self.ca

    @property
    def serving_from_store(self) -> bool:
        """Its own serving key; the certificate an api process issued it into the store; Join and Renew forwarded."""
        return "gateway" in self.roles and not self.ca

    @property
    def relays_trust(self) -> bool:
        """Hands nodes the trust bundle a key-holding process published, as stored (it holds no key that signs)."""
        return not self.ca and not self.worker_key

    @property
    def listens(self) -> bool:
        """Answers gRPC calls (Admin and Join for api, Session and forwarded Join for gateway) on `--listen`."""
        return bool(self.roles & {"api", "gateway"})


_NEEDS: tuple[tuple[str, Callable[[KeyPlan], bool], str], ...] = (
    ("listen", lambda p: p.listens, "--listen needs a role that listens (api or gateway)"),
    ("advertise", lambda p: p.listens, "--advertise names a listener's addresses and needs api or gateway"),
    ("release_listen", lambda p: p.listens, "--release-listen needs a role that listens (api or gateway)"),
    ("api", lambda p: p.serving_from_store, "--api is where a gateway without the api role forwards Join and Renew"),
    ("tunnels", lambda p: p.ca, "--tunnels makes the exec-ticket key beside the CA, in a process with the api role"),
    (
        "command_signing",
        lambda p: p.ca,
        "--command-signing is decided where the signing keys are made, by a process with the api role",
    ),
)


def check_flags(roles: frozenset[str], given: Collection[str]) -> None:
    """Refuse a flag given explicitly (`given`: parameter names) that this process's roles would ignore."""
    plan = KeyPlan(roles)
    for name, needed, why in _NEEDS:
        if name in given and not needed(plan):
            raise UsageError(f"{why}; --roles {','.join(sorted(roles))} would ignore it")
