"""`kubernetes`: the node joins a Kubernetes cluster with `kubeadm join` and a bootstrap token from the spec.

Settings: `{"api_server": "10.0.0.1:6443", "token": "abcdef.0123456789abcdef",
"ca_cert_hashes": ["sha256:…"], "labels": {"bc.dev/pool": "a"}}`.

The token is a secret: it reaches kubeadm only in a 0600 JoinConfiguration
that is removed after the join (agent.converge.kubeadm), never on a command
line; every message that may carry a tool's output is redacted; the unit's
record keeps a digest of the settings, not the settings (`secret_settings`).
With `token_secret_ref` instead of `token` the spec names a secret of the
broker (docs/secrets.md) and holds no token: the join asks for it, bound to
the host section, this unit and the pass's generation, only when it is about
to join, and keeps it no longer than the join (a joined node never asks). No
answer, or a refusal, fails the join retryably (PROGRESSING, `JoinFailed`
naming the secret and the reason); a value that is not a bootstrap token too.

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

import dataclasses
from collections.abc import Mapping
from typing import Any

from agent.converge.host_units.base import Applied, HostContext, Record, bad, good
from agent.converge.kubeadm import KUBELET_CONF, RESET_ARGV
from agent.converge.secret_port import SecretRefused, SecretUnavailable
from agent.health.rules import KUBERNETES_JOINED, Verdict
from bc.protocol.host_units import Join, is_bootstrap_token, parse_join, with_node_labels

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


async def with_token(join: Join, ctx: HostContext) -> Join:
    """The join with its token: the spec's own, or the secret `token_ref` names (OSError when there is none:
    the unit is retried on the next pass)."""
    if not join.token_ref:
        return join
    if ctx.secrets is None:
        raise OSError(f"the join token is the secret {join.token_ref!r}, and this agent has no secret broker")
    try:
        raw = await ctx.secrets.get(join.token_ref, "host", ctx.generation, unit="kubernetes")
    except (SecretUnavailable, SecretRefused) as e:
        raise OSError(f"the join token's secret {join.token_ref!r}: {e}") from None
    token = raw.decode("utf-8", "replace").strip()
    if not is_bootstrap_token(token):  # never echoed: it is a secret
        raise OSError(f"the secret {join.token_ref!r} is not a bootstrap token (6 and 16 of a-z 0-9, joined by a dot)")
    return dataclasses.replace(join, token=token)


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
                join, _skipped = with_node_labels(await with_token(desired, ctx), ctx.node_labels())
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
