"""`kubernetes`: the node joins a Kubernetes cluster with `kubeadm join` and a bootstrap token from the spec.

Settings: `{"api_server": "10.0.0.1:6443", "token": "abcdef.0123456789abcdef",
"ca_cert_hashes": ["sha256:…"], "labels": {"bc.dev/pool": "a"}}`.

The token is a secret: it reaches kubeadm only in a 0600 JoinConfiguration
that is removed after the join (agent.converge.kubeadm), never on a command
line; every message that may carry a tool's output is redacted; the unit's
record keeps a digest of the settings, not the settings (`secret_settings`).
Until bc has a secret broker the token sits in the NodeSpec itself, readable
by whoever reads the spec (docs/host.md says so).

The node has joined while `etc/kubernetes/kubelet.conf` exists (kubeadm's own
test). A pass joins when it does not; a node already joined (by hand, or an
earlier spec) is kept as it is. A new `api_server` or CA hash is another
cluster: `kubeadm reset --force`, then the join. A new token or new labels
change nothing on a joined node (kubeadm does not relabel; the labels are
the kubelet's `node-labels` at registration).

`KubernetesJoined`: True `Joined`; False `JoinFailed` (the redacted error),
`NotJoined`. Removing the unit runs `kubeadm reset --force` on a joined node.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.converge.host_units.base import Applied, HostContext, Record, bad, good
from agent.converge.kubeadm import KUBELET_CONF, RESET_ARGV
from agent.health.rules import KUBERNETES_JOINED, Verdict
from bc.protocol.host_units import Join, parse_join

CONDITION = (KUBERNETES_JOINED, "True")


def cluster(join: Join) -> dict[str, Any]:
    """What names the cluster (a change is another cluster); nothing secret."""
    return {"api_server": join.api_server, "ca_cert_hashes": list(join.ca_cert_hashes)}


def plan(join: Join, joined: bool, record: Record | None) -> list[str]:
    """The steps of a pass: `reset` (another cluster), `join`; empty when the node is where the spec wants it."""
    other = record is not None and record.undo.get("cluster") not in (None, cluster(join))
    if joined and other:
        return ["reset", "join"]
    return [] if joined else ["join"]


class Kubernetes:
    name = "kubernetes"
    condition, good = CONDITION
    secret_settings = True

    def parse(self, settings: Mapping[str, Any]) -> Join:
        return parse_join(settings)

    async def check(self, desired: Join, ctx: HostContext) -> None:
        return None

    async def drifted(self, desired: Join, record: Record, ctx: HostContext) -> bool:
        return bool(plan(desired, await ctx.ops.exists(KUBELET_CONF), record))

    async def apply(self, desired: Join, record: Record | None, ctx: HostContext) -> Applied:
        for step in plan(desired, await ctx.ops.exists(KUBELET_CONF), record):
            if step == "reset":
                await ctx.ops.command(*RESET_ARGV)
            else:
                await ctx.ops.kubeadm_join(desired)
        return Applied(undo={"cluster": cluster(desired)})

    async def remove(self, record: Record, ctx: HostContext) -> None:
        if await ctx.ops.exists(KUBELET_CONF):
            await ctx.ops.command(*RESET_ARGV)

    async def conditions(self, desired: Join, error: str | None, ctx: HostContext) -> list[Verdict]:
        if error is not None:
            return [bad(CONDITION, "JoinFailed", error)]
        if not await ctx.ops.exists(KUBELET_CONF):
            return [bad(CONDITION, "NotJoined", f"not joined to {desired.api_server}")]
        return [good(CONDITION, "Joined", f"joined to {desired.api_server}")]
