"""The instances' network rules on this host: loaded before any domain starts, and kept loaded.

`InstanceNetwork.apply` is the converger's (once per pass, before any step). Until some instance has a
NIC it loads nothing (a host without VM networks keeps its firewall as it is, nft or not); from then on it
builds the ruleset for every instance the pass keeps (agent.instances.net.ruleset, with the host's addresses
on their bridges) and loads it with one `nft -f` when it differs from what is loaded, or when the guard found
the tables changed and could not put them back (listing the tables is the guard's: at 4,000 rules one list
costs nft over a second). It answers None, or nft's one line when the rules did not load (the old ones then
stay, whole).

`failures` turns that answer into the instances it fails: every instance with NICs or a confining policy
(`PRIVATE`, `NONE`, `ssh_from_host_only`) when the rules did not load, so none runs outside them (the
converger stops those that run); without a loader at all (`--fake-hw`), only the confined ones, since
nothing there could confine them.

`run` is the guard: every `interval_s` (5 s) it lists the three tables (`nft -j list table …`) and counts
their rules against the ruleset it loaded. A flushed table or chain, a deleted table, `flush ruleset` or
a rule someone added all differ: it loads the same ruleset again at once, outside any converge pass, logs
`event=instance.rules-restored` and calls `on_restored` (the agent journals the node event
`instance.rules-restored`). A reload that fails is logged and tried again on the next tick.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence

from agent.instances.net import nft, taps
from agent.instances.net.ruleset import TABLES, HostAddresses, Ruleset, build, taps_of
from bc.protocol import instance_net_rules as net_rules
from bc.protocol.pb import spec_pb2

log = logging.getLogger(__name__)

GUARD_INTERVAL_S = 5.0
RESTORED_EVENT = "instance.rules-restored"


class InstanceNetwork:
    def __init__(
        self,
        *,
        nft_binary: str = nft.NFT,
        host_addresses: Callable[[Iterable[str]], Awaitable[HostAddresses]] = taps.host_addresses,
        on_restored: Callable[[dict[str, object]], Awaitable[None]] | None = None,
        interval_s: float = GUARD_INTERVAL_S,
    ) -> None:
        self.nft_binary = nft_binary
        self.host_addresses = host_addresses
        self.on_restored = on_restored
        self.interval_s = interval_s
        self.loaded: Ruleset | None = None
        """The ruleset last loaded, which the guard keeps in place."""
        self.restores = 0
        self.whole = True
        """False while the guard found the tables changed and could not load them again: the next pass loads."""
        self._lock = asyncio.Lock()  # one nft transaction at a time: a pass and the guard may meet

    async def apply(self, instances: Sequence[spec_pb2.Instance]) -> str | None:
        """Load the rules for these instances (None), or say in one line why they did not load."""
        if self.loaded is None and not any(inst.nics for inst in instances):
            return None  # no NIC to guard and nothing of ours loaded: the host's firewall is left as it is
        bridges = [nic.bridge for inst in instances for nic in inst.nics]
        try:
            host = await self.host_addresses(bridges)
        except OSError as e:
            return f"cannot read the host's addresses on its bridges: {e}"
        ruleset = build(taps_of(instances), host)
        async with self._lock:
            if self.loaded is not None and self.loaded.text == ruleset.text and self.whole:
                return None  # the guard watches what is loaded; listing it here too would double nft's work
            try:
                await nft.load(ruleset.text, nft=self.nft_binary)
            except nft.NftError as e:
                log.error("event=instance.rules-failed error=%r", str(e))
                return str(e)
            self.loaded, self.whole = ruleset, True
        log.info("event=instance.rules-loaded rules=%d", sum(ruleset.counts.values()))
        return None

    async def _drift(self) -> list[str]:
        assert self.loaded is not None
        return await drift(self.loaded, self.nft_binary, "instance.rules-unreadable")

    async def check(self) -> bool:
        """One guard pass: True when it found the rules changed and loaded them again."""
        async with self._lock:
            if self.loaded is None:
                return False
            drift = await self._drift()
            if not drift:
                return False
            try:
                await nft.load(self.loaded.text, nft=self.nft_binary)
            except nft.NftError as e:
                self.whole = False
                log.error("event=instance.rules-restore-failed drift=%r error=%r", drift, str(e))
                return False
            self.whole = True
        self.restores += 1
        log.warning("event=%s drift=%r", RESTORED_EVENT, drift)
        if self.on_restored is not None:
            await self.on_restored({"tables": drift})
        return True

    async def run(self, stopped: asyncio.Event) -> None:
        """The guard, until `stopped`."""
        while not stopped.is_set():
            try:
                async with asyncio.timeout(self.interval_s):
                    await stopped.wait()
                return
            except TimeoutError:
                pass
            await self.check()


async def failures(network: InstanceNetwork | None, instances: Sequence[spec_pb2.Instance]) -> dict[str, str]:
    """Load the rules for these (checked) instances; the ones that cannot run, by id, with why."""
    if network is None:
        return {
            i.id: "its network policy cannot be enforced: this host loads no network rules"
            for i in instances
            if net_rules.guarded(i)
        }
    why = await network.apply(instances)
    if why is None:
        return {}
    return {i.id: f"its network rules did not load: {why}" for i in instances if i.nics or net_rules.guarded(i)}


async def drift(loaded: Ruleset, nft_binary: str, unreadable_event: str) -> list[str]:
    """The tables whose rule count is not what `loaded` put there (as `family name: found/expected`): the
    guard's check, the agent's own and the helper's `vm.rules` with `restore`."""
    out: list[str] = []
    for family, name in TABLES:
        expected = loaded.counts[(family, name)]
        try:
            found = await nft.rule_count(family, name, nft=nft_binary)
        except nft.NftError as e:
            log.warning("event=%s error=%r", unreadable_event, str(e))
            found = None
        if found != expected:
            out.append(f"{family} {name}: {'missing' if found is None else found}/{expected}")
    return out
