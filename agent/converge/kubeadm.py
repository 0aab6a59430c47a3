"""The `kubernetes` unit's join: kubeadm's JoinConfiguration, rendered from validated settings. Pure, no I/O.

The bootstrap token never goes on a command line (where `ps` shows it) or in
a message: the configuration carrying it is written 0600 under
`etc/kubernetes/`, `kubeadm join --config` reads it, and it is removed
whatever the join did (`JOIN_CONFIG`). Every message that may carry a tool's
output goes through `redact` first. Used by the direct HostOps and by `bc
helper`, which renders it itself from the fields it validated.

The node's labels are the kubelet's `node-labels`, set when it registers
(later changes are the cluster's: kubeadm never relabels a joined node).
"""

from __future__ import annotations

import json

from bc.protocol.host_units import Join

JOIN_CONFIG = "etc/kubernetes/bc-join.yaml"
KUBELET_CONF = "etc/kubernetes/kubelet.conf"
"""Written by `kubeadm join`: while it exists the node has joined (kubeadm's own preflight check)."""
RESET_ARGV = ("kubeadm", "reset", "--force")
REDACTED = "<token>"


def join_argv(config_path: str) -> list[str]:
    return ["kubeadm", "join", "--config", config_path]


def render_join(join: Join) -> bytes:
    """A v1beta3 JoinConfiguration (every string JSON-quoted: a valid YAML scalar whatever it holds)."""
    q = json.dumps
    lines = [
        "# Written by bc (host unit kubernetes) for one kubeadm join, then removed.",
        "apiVersion: kubeadm.k8s.io/v1beta3",
        "kind: JoinConfiguration",
        "discovery:",
        "  bootstrapToken:",
        f"    apiServerEndpoint: {q(join.api_server)}",
        f"    token: {q(join.token)}",
        "    caCertHashes:",
        *(f"    - {q(h)}" for h in join.ca_cert_hashes),
    ]
    if join.labels:
        labels = ",".join(f"{k}={v}" for k, v in join.labels)
        lines += ["nodeRegistration:", "  kubeletExtraArgs:", f"    node-labels: {q(labels)}"]
    return ("\n".join(lines) + "\n").encode()


def redact(text: str, join: Join) -> str:
    """`text` without the token, nor its secret half (a tool may print either)."""
    if not join.token:
        return text  # a join whose token is still a secret's name holds nothing to hide
    secret = join.token.split(".", 1)[-1]
    return text.replace(join.token, REDACTED).replace(secret, REDACTED)
