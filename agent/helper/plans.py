"""What a planner returns: the effects, the layout they live under, and the refusal; and the argument readers.

Shared by the operation tables (`ops`, `update_ops`, `kmsg`, `gpu_ops`), which are pure,
and by the code that carries a plan out as root (`effects`, `update_effects`,
`follow`). Every path an effect names is built by a planner from the
`Layout` and fixed names; none comes from a request.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.upgrade.swap_rules import Refused as RefusedRelease
from agent.upgrade.swap_rules import Step
from bc.pki.releases import Release


class Refused(ValueError):
    """A request outside the table or failing its checks: nothing was touched."""


@dataclass(frozen=True)
class Layout:
    """Where the helper's files live, all under one root (`/` on a host, a temp dir in tests)."""

    root: Path
    node_data_dir: Path | None = None
    """The node's data dir (`bc node --data-dir`), as root was told it (`bc helper --node-data-dir`); None: the
    packaged unit's `/var/lib/bc-node` under the root. Root reads instance records there, never writes them."""
    instance_bridges: tuple[str, ...] = ()
    """The bridges root may put an instance's tap on (`bc helper --instance-bridge`); none: no tap at all."""

    @property
    def node_data(self) -> Path:
        return self.node_data_dir if self.node_data_dir is not None else self.root / "var/lib/bc-node"

    @property
    def instances_dir(self) -> Path:
        """The qemu runtime's instance directories (`<node data>/instances/<id>/vm.json`)."""
        return self.node_data / "instances"

    @property
    def user_data_dir(self) -> Path:
        """The node's instance user data (`$RUNTIME_DIRECTORY/user-data` of its unit: `/run/bc/user-data/<id>`)."""
        return self.root / "run/bc/user-data"

    @property
    def sysfs(self) -> Path:
        """The kernel's PCI interface (agent.instances.vfio.SysfsVfio): `/sys` on a host."""
        return self.root / "sys"

    @property
    def vfio_dev(self) -> Path:
        """The VFIO group nodes: `/dev/vfio` on a host."""
        return self.root / "dev/vfio"

    @property
    def cdi_dir(self) -> Path:
        return self.root / "etc/cdi"

    @property
    def env_dir(self) -> Path:
        return self.root / "run/bc/allocations"

    @property
    def ssh_dir(self) -> Path:
        return self.root / "etc/ssh/bc"

    @property
    def cgroup_root(self) -> Path:
        return self.root / "sys/fs/cgroup"

    @property
    def install_dir(self) -> Path:
        """The A/B install (agent.upgrade.slots): `bc.a`, `bc.b`, `current`, `upgrade.json`."""
        return self.root / "opt/bc"

    @property
    def release_roots(self) -> Path:
        """Root's list of the release-signing roots the helper trusts (docs/node-security.md says why here)."""
        return self.root / "etc/bc/release-roots.pem"

    @property
    def kube_clusters(self) -> Path:
        """Root's list of the Kubernetes clusters this node may join: `<api server> sha256:<CA hash>` a line."""
        return self.root / "etc/bc/kubernetes-clusters"

    @property
    def kmsg(self) -> Path:
        """The kernel log: /dev/kmsg on a host; a FIFO under a test's root."""
        return self.root / "dev/kmsg"


# Effects: what the server carries out, in order; the first that fails stops the rest.


@dataclass(frozen=True)
class Write:
    path: Path
    data: bytes
    mode: int = 0o644


@dataclass(frozen=True)
class WriteInPlace:
    """A kernel attribute (sysfs, cgroupfs): written, never renamed over."""

    path: Path
    text: str


@dataclass(frozen=True)
class Remove:
    path: Path


@dataclass(frozen=True)
class Run:
    argv: tuple[str, ...]
    timeout_s: float = 0.0
    """0: the helper's default (agent.helper.effects.COMMAND_TIMEOUT_S); a package install takes longer."""


@dataclass(frozen=True)
class MergeConfig:
    """Merge bc's CDI keys into (or out of) a container runtime's configuration file as root
    (agent.converge.runtime_config): the helper reads the file and keeps every other setting."""

    path: Path
    kind: str
    cdi_dirs: tuple[str, ...]
    present: bool


@dataclass(frozen=True)
class KubeadmJoin:
    """`kubeadm join --config` of a 0600 file (removed whatever the join did), once the cluster is one root
    listed in `clusters` (its API server with every CA hash); no message carries the token."""

    config: Path
    data: bytes = field(repr=False)
    argv: tuple[str, ...]
    clusters: Path
    api_server: str
    ca_cert_hashes: tuple[str, ...]
    secrets: tuple[str, ...] = field(repr=False)


@dataclass(frozen=True)
class Reply:
    """No effect: a value returned to the caller."""

    value: dict[str, Any]


@dataclass(frozen=True)
class UpdateStage:
    """Append `data` at `offset` to the staged release in the install dir `path` (the slot `current` does not
    name, 0600 until it is verified); offset 0 starts it anew."""

    path: Path
    offset: int
    data: bytes


@dataclass(frozen=True)
class UpdateInstall:
    """Verify the staged file against `release` (signature under the roots in `roots`, digest, swap rules) and
    place it in its slot of the install dir `path`."""

    path: Path
    roots: Path
    release: Release
    signature: bytes
    keys: tuple[tuple[bytes, bytes], ...]
    """(release key, a root's endorsement of it) pairs offered by the agent; only endorsed ones count."""
    running_version: str


@dataclass(frozen=True)
class UpdateStep:
    """One step of agent.upgrade.swap_rules on the install dir `path`; ARM's release is the placed slot's."""

    path: Path
    step: Step
    command_id: str = ""
    deadline: float = 0.0


@dataclass(frozen=True)
class UpdateRemember:
    """The install record's last refused release (None: forgotten)."""

    path: Path
    refused: RefusedRelease | None


@dataclass(frozen=True)
class FollowKmsg:
    """Stream the XID records of the kernel log at `path` after sequence `after_seq` (a stream operation)."""

    path: Path
    after_seq: int


@dataclass(frozen=True)
class TpmCall:
    """One TPM operation of the helper's own TPM (agent.helper.tpm_ops): `action` names it, `handle` is one of the
    helper's persistent handles (chosen by the helper from a slot), the blobs are checked for size and shape."""

    action: str
    handle: int = 0
    digest: bytes = b""
    credential: bytes = b""
    secret: bytes = field(default=b"", repr=False)


@dataclass(frozen=True)
class VmVfio:
    """`vm.vfio` (`give` True) or `vm.unvfio` of the instance whose record is `<instances>/<instance_id>/vm.json`
    (agent.helper.vm_effects): root reads the record itself and checks every group before it touches one."""

    instances: Path
    instance_id: str
    give: bool


@dataclass(frozen=True)
class VmLaunch:
    """`vm.launch`: root checks the record (and `user_data/<instance_id>` when `user_data`), builds qemu's argv
    from it and starts qemu as the record's VMM user (agent.helper.vm_effects.launch)."""

    instances: Path
    instance_id: str
    paused: bool
    user_data: Path | None
    accel: tuple[str, ...] = ("kvm", "tcg")


@dataclass(frozen=True)
class VmStop:
    """`vm.stop`: end that instance's qemu (only a process of its VMM user whose command line is that instance's
    qemu) and give back the VFIO group nodes its user held."""

    instances: Path
    instance_id: str


@dataclass(frozen=True)
class VmTaps:
    """`vm.taps` (`up`) or `vm.untaps`: the taps the record's NICs name by their index, owned by its VMM user, on
    `bridges` only (agent.helper.vm_net); `vm.untaps` deletes those names, each only if it is a tap."""

    instances: Path
    instance_id: str
    up: bool
    bridges: tuple[str, ...] = ()


@dataclass(frozen=True)
class VmVolume:
    """`vm.grant-volume` (`give`) or `vm.revoke-volume`: the volume file the record lists under `volume_id`,
    its group the running VMM's (0660, 0640 read-only) or back to the node's (0600) (agent.helper.vm_effects)."""

    instances: Path
    instance_id: str
    volume_id: str
    give: bool


@dataclass(frozen=True)
class VmRules:
    """`vm.rules`: the instances' nftables ruleset built by root from the network record under `node_data` and
    loaded when it changed; with `restore`, the guard's tick: the loaded tables compared and put back."""

    node_data: Path
    restore: bool


Effect = (
    Write
    | WriteInPlace
    | Remove
    | Run
    | Reply
    | UpdateStage
    | UpdateInstall
    | UpdateStep
    | UpdateRemember
    | FollowKmsg
    | MergeConfig
    | KubeadmJoin
    | TpmCall
    | VmVfio
    | VmLaunch
    | VmStop
    | VmTaps
    | VmRules
    | VmVolume
)
Plan = tuple[Effect, ...]
Planner = Callable[[Mapping[str, Any], Layout], Plan]


# Argument readers: each refuses with the argument's name.


def arg_str(req: Mapping[str, Any], key: str, *, limit: int = 256) -> str:
    v = req.get(key)
    if not isinstance(v, str) or len(v) > limit:
        raise Refused(f"{key} must be a string of at most {limit} characters")
    return v


def arg_int(req: Mapping[str, Any], key: str, lo: int, hi: int) -> int:
    v = req.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise Refused(f"{key} must be an integer from {lo} to {hi}")
    return v
