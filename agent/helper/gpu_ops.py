"""The helper's operations for the GPU node host units: packages, container runtime CDI, a Kubernetes join. Pure.

    op                   arguments                          effects (as root)
    host.package         manager (apt|dnf), action          the unit's package at that branch/version, from the OS's
                         (install|release), unit             own repositories (agent.converge.gpu_packages builds
                         (nvidia-driver|fabric-manager|      the argv: `apt-get install … nvidia-driver-550=…-*`,
                         container-toolkit), branch,         `apt-mark hold|unhold`, `dnf install -y …`)
                         version
    host.runtime.config  runtime (containerd|docker|cri-o|  bc's CDI keys merged into (present) or out of that
                         toolkit), present                   runtime's file under the helper's root, pointing at the
                                                             helper's own CDI directory; the operator's settings kept
    host.kubeadm.join    api_server, token, ca_cert_hashes,  only for a cluster root listed in
                         labels                              `etc/bc/kubernetes-clusters` (`<api server> <CA hash>` a
                                                             line, every hash asked listed): a 0600 JoinConfiguration,
                                                             `kubeadm join --config` it, the file removed

Every field is checked by the same parsers the control plane and the agent
run (bc.protocol.host_units); package names, paths and argv are built here
from them, never taken from the request. The CDI directory is the helper's
(`Layout.cdi_dir`), not one the agent names. Joining a cluster hands the node
to that cluster's control plane, so the helper takes the cluster from root's
list, not from the agent: a compromised agent cannot join the node elsewhere.
No refusal or failure message carries the token.

The units' fixed commands (the driver module reload, Fabric Manager's
`systemctl`, the runtimes' restarts, `kubeadm reset --force`) are in
`host.run`'s table (agent.helper.ops.HOST_COMMANDS).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.converge import gpu_packages, kubeadm, runtime_config
from agent.helper.plans import KubeadmJoin, Layout, MergeConfig, Plan, Planner, Refused, Run, arg_str
from bc.protocol.host_units import UnitInvalid, parse_driver, parse_join, parse_toolkit

PACKAGE_TIMEOUT_S = 1800.0


def _package(req: Mapping[str, Any]) -> tuple[str, str, gpu_packages.Package]:
    manager, action, unit = arg_str(req, "manager"), arg_str(req, "action"), arg_str(req, "unit")
    if manager not in gpu_packages.MANAGERS:
        raise Refused(f"manager {manager[:20]!r} is not apt or dnf")
    if action not in ("install", "release"):
        raise Refused(f"action {action[:20]!r} is not install or release")
    branch, version = arg_str(req, "branch", limit=8), arg_str(req, "version", limit=24)
    try:
        if unit in ("nvidia-driver", "fabric-manager"):
            d = parse_driver({"branch": branch, **({"version": version} if version else {})})
            branch, version = d.branch, d.version
        elif unit == "container-toolkit":
            if branch:
                raise Refused("container-toolkit has no branch")
            version = parse_toolkit({"runtimes": ["containerd"], "version": version}).version
        else:
            raise Refused(f"unit {unit[:40]!r} is not nvidia-driver, fabric-manager or container-toolkit")
    except UnitInvalid as e:
        raise Refused(str(e).split(": ", 1)[-1]) from None
    return manager, action, gpu_packages.Package(unit, branch, version)


def _host_package(req: Mapping[str, Any], lay: Layout) -> Plan:
    manager, action, pkg = _package(req)
    argvs = gpu_packages.install_argv(manager, pkg) if action == "install" else gpu_packages.release_argv(manager, pkg)
    return tuple(Run(tuple(argv), PACKAGE_TIMEOUT_S) for argv in argvs)


def _runtime_config(req: Mapping[str, Any], lay: Layout) -> Plan:
    kind, present = arg_str(req, "runtime"), req.get("present")
    if kind not in runtime_config.CONFIG_FILES:
        raise Refused(f"runtime {kind[:20]!r} is not one of {', '.join(runtime_config.CONFIG_FILES)}")
    if not isinstance(present, bool):
        raise Refused("present must be true or false")
    dirs = tuple(runtime_config.cdi_dirs(str(lay.cdi_dir)))
    return (MergeConfig(lay.root / runtime_config.CONFIG_FILES[kind], kind, dirs, present),)


def _kubeadm_join(req: Mapping[str, Any], lay: Layout) -> Plan:
    fields = {k: req[k] for k in ("api_server", "token", "ca_cert_hashes", "labels") if k in req}
    try:
        join = parse_join(fields)
    except UnitInvalid as e:  # the parser's messages never carry the token
        raise Refused(str(e).split(": ", 1)[-1]) from None
    config = lay.root / kubeadm.JOIN_CONFIG
    return (
        KubeadmJoin(
            config=config,
            data=kubeadm.render_join(join),
            argv=tuple(kubeadm.join_argv(str(config))),
            clusters=lay.kube_clusters,
            api_server=join.api_server,
            ca_cert_hashes=join.ca_cert_hashes,
            secrets=(join.token, join.token.split(".", 1)[1]),
        ),
    )


TABLE: dict[str, tuple[frozenset[str], Planner]] = {
    "host.package": (frozenset({"manager", "action", "unit", "branch", "version"}), _host_package),
    "host.runtime.config": (frozenset({"runtime", "present"}), _runtime_config),
    "host.kubeadm.join": (frozenset({"api_server", "token", "ca_cert_hashes", "labels"}), _kubeadm_join),
}
