"""The command kinds: the single table the control plane, the gateway and the agent all read.

Each kind has a lane, the agent roles that run it, its flags and its timeout
(how long past `not_after` an in-flight command may stay unsettled before the
sweeper fails it `timeout`; for self-terminating kinds it covers the rejoin).
The table follows the reference's "Kinds by lane", "Timeouts" and the
destructive list of the quorum.
"""

from __future__ import annotations

from dataclasses import dataclass

from bc.protocol.pb import session_pb2

LANES: dict[str, int] = {"control": session_pb2.CONTROL, "provision": session_pb2.PROVISION, "bulk": session_pb2.BULK}
LANE_NAMES: dict[int, str] = {v: k for k, v in LANES.items()}
GATEWAY_CREDITS: dict[str, int] = {"control": 8, "provision": 4, "bulk": 2}
AGENT_WORKERS: dict[str, int] = {"control": 4, "provision": 2, "bulk": 1}
DEFAULT_TIMEOUT_S = 15 * 60


@dataclass(frozen=True)
class Kind:
    name: str
    lane: str
    roles: frozenset[str]
    retry_safe: bool = False
    self_terminating: bool = False
    attested: bool = False
    destructive: bool = False
    timeout_s: int = DEFAULT_TIMEOUT_S


def _k(name: str, lane: str, roles: str, *flags: str, timeout_min: float = 15) -> Kind:
    unknown = set(flags) - {"retry-safe", "self-terminating", "attested", "destructive"}
    assert not unknown, unknown
    return Kind(
        name=name,
        lane=lane,
        roles=frozenset(roles.split(",")),
        retry_safe="retry-safe" in flags,
        self_terminating="self-terminating" in flags,
        attested="attested" in flags,
        destructive="destructive" in flags,
        timeout_s=int(timeout_min * 60),
    )


KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        _k("inventory.refresh", "control", "node,site,ramdisk", "retry-safe", timeout_min=2),
        _k("diag.nvml", "control", "node,ramdisk", "retry-safe", "attested", timeout_min=2),
        _k("gpu.reset", "control", "node", "attested", "destructive", timeout_min=5),
        _k("node.reboot", "control", "node,site", "retry-safe", "self-terminating", "destructive", timeout_min=15),
        _k("bmc.query", "control", "site", "retry-safe", timeout_min=2),
        _k("bmc.boot", "control", "site", "retry-safe", "destructive", timeout_min=2),
        _k("bmc.power", "control", "site", "destructive", timeout_min=5),
        _k("bmc.firmware", "control", "site", "destructive", timeout_min=60),
        _k("bmc.storage", "control", "site", "destructive", timeout_min=60),
        _k("bmc.rotate", "control", "site", "attested", "destructive", timeout_min=5),
        _k("site.httpProxy", "control", "site", "destructive", timeout_min=1),
        _k("boot.prepareRamdisk", "control", "site", "retry-safe", timeout_min=2),
        _k("boot.cleanUp", "control", "site", "retry-safe", timeout_min=2),
        _k("boot.kexec", "control", "ramdisk", "self-terminating", timeout_min=15),
        _k("disk.wipe", "provision", "ramdisk", "attested", "destructive", timeout_min=360),
        _k("deploy.image", "provision", "ramdisk", "destructive", timeout_min=60),
        _k("diag.dcgm", "provision", "ramdisk,node", "retry-safe", "attested", timeout_min=60),
        _k("driver.invoke", "provision", "node,site,ramdisk", "destructive"),
        _k("logs.collect", "bulk", "node,site,ramdisk", "retry-safe", timeout_min=15),
        _k("instance.snapshot", "bulk", "node"),
        _k("daemon.upgrade", "control", "node,site", "self-terminating", timeout_min=15),
    )
}


def get(name: str) -> Kind | None:
    return KINDS.get(name)


def timeout_s(name: str) -> int:
    """The sweeper's timeout past `not_after`; an unregistered kind gets 15 minutes."""
    k = KINDS.get(name)
    return k.timeout_s if k else DEFAULT_TIMEOUT_S


DESTRUCTIVE: frozenset[str] = frozenset(k.name for k in KINDS.values() if k.destructive)
ATTESTED: frozenset[str] = frozenset(k.name for k in KINDS.values() if k.attested)


def is_attested(name: str) -> bool:
    """Results of these kinds count only with the node's own signature (reference: attested results)."""
    return name in ATTESTED
