"""What root accepts before it makes a tap or loads the instances' nftables rules for the node. Pure, no I/O.

Two claims of the node's, each read by root itself (agent.helper.vm_net):

* an instance's record (`vm.json`, already checked by agent.helper.vm_rules) names its NICs: root makes
  only the tap each NIC's index names (agent.instances.net.names.tap_name: the id and the index, never a
  name the node chose), and only on a bridge the operator listed (`bc helper --instance-bridge NAME`):
  a tap on any other bridge would put a guest on a network root was never told about;
* the network record (`<node data>/instance-net.json`, which the agent rewrites each pass from the
  section, since a policy or an address changes while a guest runs and `vm.json` is written only at
  define) holds every kept instance's network fields as the spec gives them. Root checks them with the
  section's own rules (bc.protocol.instance_net_rules) and builds the ruleset with the agent's own builder
  (agent.instances.net.ruleset): every string it puts in nft's text has been checked first.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from agent.instances.net.names import tap_name
from bc.protocol import instance_net_rules as net_rules
from bc.protocol.instance_rules import INSTANCE_ID
from bc.protocol.pb import spec_pb2

NET_RECORD = "instance-net.json"
MAX_INSTANCES = 10_000
BRIDGE_FLAG = "--instance-bridge"


class NetRefused(ValueError):
    """One sentence: why root will not make these taps or load these rules."""


def bridge_refusal(bridge: str, allowed: Collection[str]) -> str | None:
    """Why root will not put a tap on `bridge`, or None."""
    if not net_rules.IFNAME.fullmatch(bridge) or bridge.startswith(net_rules.TAP_PREFIX):
        return f"{bridge[:40]!r} is not a bridge name an instance may use"
    if not allowed:
        return f"bc helper was given no bridge for instances ({BRIDGE_FLAG} NAME), so it makes no tap on {bridge}"
    if bridge not in allowed:
        return f"the bridge {bridge} is not one bc helper was given ({BRIDGE_FLAG}: {', '.join(sorted(allowed))})"
    return None


def record_taps(doc: Mapping[str, object], instance_id: str, allowed: Collection[str] | None) -> list[tuple[str, str]]:
    """The (tap, bridge) of each NIC of an accepted record, each tap the one its index names and each bridge
    allowed (NetRefused with one sentence: nothing is made). `allowed` None: the bridges are not checked (a
    tap being deleted goes wherever it is)."""
    nics = doc.get("nics") or []
    if not isinstance(nics, list) or len(nics) > net_rules.MAX_NICS:
        raise NetRefused(
            f"instance {instance_id}'s record has NICs that are not a list of at most {net_rules.MAX_NICS}"
        )
    out: list[tuple[str, str]] = []
    for i, nic in enumerate(nics):
        tap = nic.get("tap") if isinstance(nic, dict) else None
        bridge = nic.get("bridge") if isinstance(nic, dict) else None
        if tap != tap_name(instance_id, i):
            raise NetRefused(f"instance {instance_id}'s NIC {i} names tap {str(tap)[:40]!r}, not its own")
        if not isinstance(bridge, str):
            raise NetRefused(f"instance {instance_id}'s NIC {i} names no bridge")
        why = bridge_refusal(bridge, allowed) if allowed is not None else None
        if why is not None:
            raise NetRefused(f"instance {instance_id}'s NIC {i}: {why}")
        out.append((tap, bridge))
    return out


def _strs(v: object, what: str) -> list[str]:
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise NetRefused(f"the network record's {what} is not a list of strings")
    return list(v)


def _instance(item: object, k: int) -> spec_pb2.Instance:
    if not isinstance(item, dict):
        raise NetRefused(f"the network record's instance {k} is not a JSON object")
    iid = item.get("id")
    if not isinstance(iid, str) or not INSTANCE_ID.fullmatch(iid):
        raise NetRefused(f"the network record's instance {k} has id {str(iid)[:80]!r}, not an instance id")
    pol, ssh = item.get("network_policy", ""), item.get("ssh_from_host_only", False)
    if not isinstance(pol, str) or not isinstance(ssh, bool):
        raise NetRefused(f"the network record's instance {iid} has a policy that is not a string and a boolean")
    nics = item.get("nics") or []
    if not isinstance(nics, list) or len(nics) > net_rules.MAX_NICS:
        raise NetRefused(f"the network record's instance {iid} has NICs that are not a list")
    inst = spec_pb2.Instance(id=iid, network_policy=pol, ssh_from_host_only=ssh)
    for i, nic in enumerate(nics):
        if not isinstance(nic, dict) or not all(isinstance(nic.get(k, ""), str) for k in ("bridge", "mac")):
            raise NetRefused(f"the network record's instance {iid} has NIC {i} without a bridge and a MAC")
        addresses = _strs(nic.get("addresses", []), f"instance {iid}'s NIC {i} addresses")
        inst.nics.add(bridge=nic["bridge"], mac=nic.get("mac", ""), addresses=addresses)
    return inst


def net_instances(doc: object) -> list[spec_pb2.Instance]:
    """The network record's instances, each checked by the section's own network rules (NetRefused)."""
    items = doc.get("instances") if isinstance(doc, dict) else None
    if not isinstance(items, list) or len(items) > MAX_INSTANCES:
        raise NetRefused(f"the network record is not a JSON object with a list of at most {MAX_INSTANCES} instances")
    out = [_instance(item, k) for k, item in enumerate(items)]
    if len({i.id for i in out}) != len(out):
        raise NetRefused("the network record names an instance twice")
    try:
        for inst in out:
            net_rules.check_nics(inst, f"the network record's instance {inst.id}")
        net_rules.check_claims(out)
    except net_rules.NetRuleError as e:
        raise NetRefused(str(e)) from None
    return out


def net_record(instances: Iterable[spec_pb2.Instance]) -> dict[str, object]:
    """The network record the agent writes for root (what `net_instances` reads back): each kept instance's
    network fields as the spec gives them."""
    return {
        "bc": 1,
        "instances": [
            {
                "id": inst.id,
                "network_policy": inst.network_policy,
                "ssh_from_host_only": inst.ssh_from_host_only,
                "nics": [{"bridge": n.bridge, "mac": n.mac, "addresses": list(n.addresses)} for n in inst.nics],
            }
            for inst in instances
        ],
    }
