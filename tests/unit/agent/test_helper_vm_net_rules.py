"""agent.helper.vm_net_rules: which taps root makes for a record, on which bridges, and what of the node's
network record it builds rules from. Each refusal is one sentence."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agent.helper.ops import VERSION, Layout, Refused, plan
from agent.helper.plans import VmRules, VmTaps
from agent.helper.vm_net_rules import NetRefused, bridge_refusal, net_instances, net_record, record_taps
from agent.instances.net.names import tap_name
from bc.protocol.pb import spec_pb2

T0, T1 = tap_name("a", 0), tap_name("a", 1)


def _record(*nics: tuple[object, object]) -> dict[str, object]:
    return {"id": "a", "nics": [{"tap": t, "bridge": b, "mac": ""} for t, b in nics]}


def test_the_record_s_taps_are_those_its_indexes_name_on_allowed_bridges() -> None:
    assert record_taps(_record((T0, "br0"), (T1, "br1")), "a", ("br0", "br1")) == [(T0, "br0"), (T1, "br1")]
    assert record_taps(_record(), "a", ()) == []  # no NIC: nothing asked, nothing refused


@pytest.mark.parametrize(
    "nics, allowed, message",
    [
        ([(T0, "br0")], (), "instance a's NIC 0: bc helper was given no bridge for instances (--instance-bridge NAME),"
         " so it makes no tap on br0"),
        ([(T0, "br9")], ("br0", "br1"),
         "instance a's NIC 0: the bridge br9 is not one bc helper was given (--instance-bridge: br0, br1)"),
        ([(T0, "bcxyz")], ("bcxyz",), "instance a's NIC 0: 'bcxyz' is not a bridge name an instance may use"),
        ([(T0, "br0"), ("eth0", "br0")], ("br0",), "instance a's NIC 1 names tap 'eth0', not its own"),
        ([(T1, "br0")], ("br0",), f"instance a's NIC 0 names tap '{T1}', not its own"),
        ([(T0, 7)], ("br0",), "instance a's NIC 0 names no bridge"),
    ],
)  # fmt: skip
def test_a_tap_root_would_not_make_is_refused_in_one_sentence(
    nics: list[tuple[object, object]], allowed: tuple[str, ...], message: str
) -> None:
    with pytest.raises(NetRefused) as e:
        record_taps(_record(*nics), "a", allowed)
    assert str(e.value) == message


def test_untaps_goes_by_the_names_alone_whatever_the_bridge() -> None:
    assert record_taps(_record((T0, "br9")), "a", None) == [(T0, "br9")]


def test_bridge_refusal_is_none_for_an_allowed_bridge() -> None:
    assert bridge_refusal("br0", ("br0",)) is None


def _inst(iid: str, *nics: tuple[str, str, list[str]], policy: str = "", ssh: bool = False) -> spec_pb2.Instance:
    inst = spec_pb2.Instance(id=iid, network_policy=policy, ssh_from_host_only=ssh)
    for bridge, mac, addresses in nics:
        inst.nics.add(bridge=bridge, mac=mac, addresses=addresses)
    return inst


def test_the_network_record_reads_back_as_the_instances_it_was_written_from() -> None:
    written = [
        _inst("a", ("br0", "52:54:00:00:00:0a", ["10.0.0.10/24"]), policy="NONE", ssh=True),
        _inst("b", ("br0", "", [])),
        _inst("c"),
    ]
    assert net_instances(net_record(written)) == written


@pytest.mark.parametrize(
    "doc, message",
    [
        ([], "the network record is not a JSON object with a list of at most 10000 instances"),
        ({"instances": [{"id": "../x"}]}, "the network record's instance 0 has id '../x', not an instance id"),
        ({"instances": [{"id": "a"}, {"id": "a"}]}, "the network record names an instance twice"),
        ({"instances": [{"id": "a", "nics": [{"bridge": "br0", "mac": "", "addresses": ["10.0.0.5/24 } drop"]}]}]},
         "the network record's instance a.nics[0].addresses[0] '10.0.0.5/24 } drop' is not an address with a prefix"
         " length"),
        ({"instances": [{"id": "a", "nics": [{"bridge": "br0", "mac": "ff:ff:ff:ff:ff:ff"}]}]},
         "the network record's instance a.nics[0].mac ff:ff:ff:ff:ff:ff is a multicast address; a guest's MAC must"
         " be unicast"),
        ({"instances": [{"id": "a", "network_policy": "OPEN"}]},
         "the network record's instance a.network_policy must be one of EGRESS, PRIVATE, NONE, not 'OPEN'"),
        ({"instances": [{"id": "a", "nics": [{"bridge": "br0", "mac": "52:54:00:00:00:01", "addresses": []}]},
                        {"id": "b", "nics": [{"bridge": "br0", "mac": "52:54:00:00:00:01", "addresses": []}]}]},
         "instances[1].nics[0].mac 52:54:00:00:00:01 is instance a's too"),
        ({"instances": [{"id": "a", "nics": [{"bridge": 3}]}]},
         "the network record's instance a has NIC 0 without a bridge and a MAC"),
    ],
)  # fmt: skip
def test_a_network_record_root_would_not_build_rules_from_is_refused(doc: object, message: str) -> None:
    with pytest.raises(NetRefused) as e:
        net_instances(doc)
    assert str(e.value) == message


@pytest.mark.parametrize(
    "request_, message",
    [
        ({"op": "vm.taps", "instance_id": "a", "bridge": "br0"}, "vm.taps takes no bridge"),
        ({"op": "vm.untaps", "instance_id": "x/../y"}, "instance_id 'x/../y' is not an instance id"),
        ({"op": "vm.rules", "restore": "yes"}, "restore must be true or false"),
        ({"op": "vm.rules", "ruleset": "flush ruleset"}, "vm.rules takes no ruleset"),
    ],
)
def test_a_network_request_names_nothing_root_builds(request_: dict[str, object], message: str) -> None:
    with pytest.raises(Refused, match=re.escape(message)):
        plan({"v": VERSION, **request_}, Layout(Path("/")))


def test_the_bridges_and_the_paths_are_the_helper_s() -> None:
    lay = Layout(Path("/r"), instance_bridges=("br0",))
    assert plan({"v": VERSION, "op": "vm.taps", "instance_id": "a"}, lay) == (
        VmTaps(Path("/r/var/lib/bc-node/instances"), "a", True, ("br0",)),
    )
    assert plan({"v": VERSION, "op": "vm.rules", "restore": True}, lay) == (VmRules(Path("/r/var/lib/bc-node"), True),)
