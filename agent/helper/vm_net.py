"""`vm.taps`, `vm.untaps` and `vm.rules` carried out as root (agent.helper.vm_ops): read the node's claim,
check it (agent.helper.vm_net_rules), then act.

Taps over netlink (pyroute2, agent.instances.net.taps, as a root agent makes them), rules with `nft`
(agent.instances.net.nft). `RootRules` is the helper's memory of the ruleset it loaded last, so the guard's
tick (`restore`) compares the kernel's tables with what root loaded, never with what the node says it
wants, and a tap is made only once the rules naming it are in place: a guest's frames never reach its
bridge before its anti-spoofing and policy rules do.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

from agent.helper import vm_effects
from agent.helper.plans import Refused, VmRules, VmTaps
from agent.helper.vm_net_rules import NET_RECORD, NetRefused, net_instances, record_taps
from agent.helper.vm_rules import RecordRefused, check_record
from agent.instances.net import nft, taps
from agent.instances.net.guard import drift
from agent.instances.net.ruleset import HostAddresses, Ruleset, build, taps_of
from agent.instances.net.taps import TapError
from agent.offload import Offload

log = logging.getLogger(__name__)

MAX_NET_RECORD = 16 << 20


class RootRules:
    """What root loaded last (None: nothing yet, since this helper started), and the taps it names."""

    def __init__(
        self,
        *,
        nft_binary: str = nft.NFT,
        host_addresses: Callable[[Iterable[str]], Awaitable[HostAddresses]] = taps.host_addresses,
    ) -> None:
        self.nft_binary = nft_binary
        self.host_addresses = host_addresses
        self.loaded: Ruleset | None = None
        self.taps: frozenset[str] = frozenset()
        self.whole = True
        """False while the tables were found changed and could not be put back: the next vm.rules loads."""


def _read_net(node_data: Path) -> object:
    """The parsed network record ({"instances": []} when there is none), opened without following a symlink."""
    try:
        fd = vm_effects._open_file(node_data, node_data / NET_RECORD)
    except Refused:
        if not os.path.lexists(node_data / NET_RECORD):
            return {"instances": []}
        raise
    try:
        data = os.read(fd, MAX_NET_RECORD + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_NET_RECORD:
        raise Refused(f"the network record {NET_RECORD} is larger than {MAX_NET_RECORD >> 20} MiB")
    try:
        return json.loads(data)
    except (ValueError, RecursionError):  # the node wrote it: nesting deep enough to end the parse is refused too
        raise Refused(f"the network record {NET_RECORD} is not JSON") from None


async def _drift(state: RootRules) -> list[str]:
    assert state.loaded is not None
    return await drift(state.loaded, state.nft_binary, "helper.vm-rules-unreadable")


async def rules(effect: VmRules, state: RootRules, offload: Offload) -> dict[str, Any]:
    if effect.restore:
        return await _restore(state)
    try:
        instances = net_instances(await offload(_read_net, effect.node_data))
    except NetRefused as e:
        raise Refused(str(e)) from None
    if state.loaded is None and not any(i.nics for i in instances):
        return {"loaded": False, "rules": 0}  # the host's firewall is left as it is until some NIC needs rules
    try:
        host = await state.host_addresses([n.bridge for i in instances for n in i.nics])
    except OSError as e:
        raise vm_effects.VmFailed(f"cannot read the host's addresses on its bridges: {e}") from None
    tap_rules = taps_of(instances)
    ruleset = build(tap_rules, host)
    count = sum(ruleset.counts.values())
    if state.loaded is not None and state.loaded.text == ruleset.text and state.whole:
        return {"loaded": False, "rules": count}
    try:
        await nft.load(ruleset.text, nft=state.nft_binary)
    except nft.NftError as e:
        raise vm_effects.VmFailed(str(e)) from None
    state.loaded, state.taps, state.whole = ruleset, frozenset(t.tap for t in tap_rules), True
    log.info("event=helper.vm-rules-loaded rules=%d", count)
    return {"loaded": True, "rules": count}


async def _restore(state: RootRules) -> dict[str, Any]:
    if state.loaded is None:
        return {"restored": False, "tables": []}
    drift = await _drift(state)
    if not drift:
        return {"restored": False, "tables": []}
    try:
        await nft.load(state.loaded.text, nft=state.nft_binary)
    except nft.NftError as e:
        state.whole = False
        changed = "; ".join(drift)
        raise vm_effects.VmFailed(f"the instances' rules changed ({changed}) and did not load again: {e}") from None
    state.whole = True
    log.warning("event=helper.vm-rules-restored drift=%r", drift)
    return {"restored": True, "tables": drift}


def _record(instances: Path, instance_id: str) -> tuple[int, dict[str, object]]:
    doc = vm_effects.read_record(instances, instance_id)
    try:
        rec = check_record(doc, instance_id, instances.parent)
    except RecordRefused as e:
        raise Refused(str(e)) from None
    assert isinstance(doc, dict)
    return rec.uid, doc


async def carry_taps(effect: VmTaps, state: RootRules, offload: Offload) -> dict[str, Any]:
    uid, doc = await offload(_record, effect.instances, effect.instance_id)
    try:
        pairs = record_taps(doc, effect.instance_id, effect.bridges if effect.up else None)
    except NetRefused as e:
        raise Refused(str(e)) from None
    names = [tap for tap, _ in pairs]
    if effect.up:
        for tap in names:
            if tap not in state.taps:
                raise Refused(f"instance {effect.instance_id}'s tap {tap} is in no rules root loaded (vm.rules first)")
    try:
        for tap, bridge in pairs:
            if effect.up:
                await taps.ensure(tap, bridge, uid)
            else:
                await taps.remove(tap)
    except TapError as e:
        raise vm_effects.VmFailed(str(e)) from None
    log.info("event=helper.vm-%s instance=%s uid=%d taps=%s", "taps" if effect.up else "untaps", effect.instance_id,
             uid, ",".join(names))  # fmt: skip
    return {"taps": names}
