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

**The node's bc labels** (`bc nodes label`, carried in its signed spec body)
are added to the settings' own `labels` (which win on a shared key) at each
join (`bc.protocol.host_units.with_node_labels`), so a node not joined yet
joins with the labels it has then; labels the kubelet may not set on itself
(the kubernetes.io and k8s.io namespaces) are left out, and the condition's
message names them.

`KubernetesJoined`: True `Joined`; False `JoinFailed` (the redacted error),
`NotJoined`. Removing the unit runs `kubeadm reset --force` on a joined node.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.converge.host_units.base import Applied, HostContext, Record, bad, good
from agent.converge.kubeadm import KUBELET_CONF, RESET_ARGV
from agent.health.rules import KUBERNETES_JOINED, Verdict
from bc.protocol.host_units import Join, parse_join, with_node_labels

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
                join, _skipped = with_node_labels(desired, ctx.node_labels())
                await ctx.ops.kubeadm_join(join)
        return Applied(undo={"cluster": cluster(desired)})

    async def remove(self, record: Record, ctx: HostContext) -> None:
        if await ctx.ops.exists(KUBELET_CONF):
            await ctx.ops.command(*RESET_ARGV)

    async def conditions(self, desired: Join, error: str | None, ctx: HostContext) -> list[Verdict]:
        _join, skipped = with_node_labels(desired, ctx.node_labels())
        left_out = f"; bc labels left out: {', '.join(k for k, _ in skipped)}" if skipped else ""
        if error is not None:
            return [bad(CONDITION, "JoinFailed", error + left_out)]
        if not await ctx.ops.exists(KUBELET_CONF):
            return [bad(CONDITION, "NotJoined", f"not joined to {desired.api_server}{left_out}")]
        return [good(CONDITION, "Joined", f"joined to {desired.api_server}{left_out}")]
