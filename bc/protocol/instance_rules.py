"""The instances section's rules, read the same way by the control plane and the node (docs/instances.md).

The control plane refuses a section that breaks them before it is stored
(`bc.protocol.spec_validation`, one sentence naming the field); the node's
converger checks each instance again (a node never trusts that the server
checked) and fails only the instance that breaks one. Pure: no I/O.

* An id is 1-63 of `a-z 0-9 -`, starting with a letter or digit: it names a
  directory, a QMP socket and, later, tap names on the node, so it is never a
  path and stays short.
* `state` is `RUNNING`, `PAUSED`, `STOPPED` or `DELETED`; empty reads as
  `RUNNING`.
* `runtime` is one this release builds (`qemu`, `libvirt`); vCPUs and memory are in range.
* The guest boots its kernel directly: `kernel` (and `initrd`) are file names in
  the node's `<data-dir>/instance-boot/`, never paths, so a spec cannot point
  a VM at an arbitrary host file. `cmdline` is printable ASCII. Or it boots a
  tenant image (`image`), with persistent `volumes`: bc.protocol.disk_rules.
* `user_data_secret_ref`, when set, is a secret's name (bc.protocol.secret_refs): the node asks the
  broker for it, bound to the instances section, and hands the guest its value at start.
* `gpus` (whole GPUs passed through with VFIO) are GPU UUIDs, at most
  `MAX_GPUS`, none twice, only with an `allocation_id`: the GPUs come from that
  allocation's `BINDING_INSTANCE` booking, and no two instances of a section
  name one GPU. The node checks the booking itself against the spec's devices
  section (agent.instances.gpu_rules).
* `restore_from` is an `https://` URL and the snapshot's SHA-256 (64 lowercase hex);
  `identity_rebind_ref` a secret's name, on a restored instance only.
* NICs, `network_policy` and `ssh_from_host_only` follow
  `bc.protocol.instance_net_rules` (no bridge named `bc…`, unicast MACs, addresses
  with a prefix, `PRIVATE`/`NONE` only with a MAC and addresses on every NIC; an
  address or MAC belongs to one NIC of the section).
"""

from __future__ import annotations

import re
from typing import Final

from bc.protocol import cpulist, disk_rules, instance_net_rules, secret_refs
from bc.protocol.atoms import GPU, parse_atom
from bc.protocol.pb import spec_pb2

RUNNING: Final = "RUNNING"
PAUSED: Final = "PAUSED"
STOPPED: Final = "STOPPED"
DELETED: Final = "DELETED"
DESIRED_STATES: tuple[str, ...] = (RUNNING, PAUSED, STOPPED, DELETED)

RUNTIMES: tuple[str, ...] = ("qemu", "libvirt")
"""The runtimes this release builds (the fake runtime of `--fake-hw` answers as `qemu`; `libvirt` runs where a
node has libvirt-python and its connection answers)."""

INSTANCE_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
BOOT_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")
ALLOCATION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
SIZE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
CMDLINE = re.compile(r"[\x20-\x7e]{0,1024}")
SHA256 = re.compile(r"[0-9a-f]{64}")
URL_TEXT = re.compile(r"[\x21-\x7e]+")
MAX_URL = 2048

MAX_VCPUS = 256
MIN_MEMORY_MIB = 16
MAX_MEMORY_MIB = 4 * 1024 * 1024
MAX_INSTANCES = 256
MAX_GPUS = 16
HUGEPAGE_SIZES_MIB: tuple[int, ...] = (2, 1024)


class InstanceRuleError(ValueError):
    """A field breaks a rule: `field` names it, `why` says why in one clause."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"{field} {why}")
        self.field, self.why = field, why


def desired_state(inst: spec_pb2.Instance) -> str:
    """The instance's desired state, empty read as RUNNING (check_instance has refused anything else)."""
    return inst.state or RUNNING


def check_instance(inst: spec_pb2.Instance, field: str = "instance") -> None:
    """Refuse (InstanceRuleError) one instance that breaks a rule; return when it is fine."""
    if not INSTANCE_ID.fullmatch(inst.id):
        raise InstanceRuleError(f"{field}.id", f"{inst.id!r} is not an instance id (1-63 of a-z 0-9 -)")
    if desired_state(inst) not in DESIRED_STATES:
        raise InstanceRuleError(f"{field}.state", f"must be one of {', '.join(DESIRED_STATES)}, not {inst.state!r}")
    if inst.runtime not in RUNTIMES:
        raise InstanceRuleError(f"{field}.runtime", f"must be one of {', '.join(RUNTIMES)}, not {inst.runtime!r}")
    if inst.size and not SIZE.fullmatch(inst.size):
        raise InstanceRuleError(f"{field}.size", f"{inst.size!r} is not a flavor name")
    if not 1 <= inst.vcpus <= MAX_VCPUS:
        raise InstanceRuleError(f"{field}.vcpus", f"must be between 1 and {MAX_VCPUS}, not {inst.vcpus}")
    if not MIN_MEMORY_MIB <= inst.memory_mib <= MAX_MEMORY_MIB:
        raise InstanceRuleError(
            f"{field}.memory_mib", f"must be between {MIN_MEMORY_MIB} and {MAX_MEMORY_MIB}, not {inst.memory_mib}"
        )
    if inst.kernel and not BOOT_FILE.fullmatch(inst.kernel):
        raise InstanceRuleError(f"{field}.kernel", f"{inst.kernel!r} is not a file name in the node's instance-boot/")
    if inst.initrd and not BOOT_FILE.fullmatch(inst.initrd):
        raise InstanceRuleError(f"{field}.initrd", f"{inst.initrd!r} is not a file name in the node's instance-boot/")
    if inst.initrd and not inst.kernel:
        raise InstanceRuleError(f"{field}.initrd", "needs a kernel: an image boots its own")
    if not CMDLINE.fullmatch(inst.cmdline):
        raise InstanceRuleError(f"{field}.cmdline", "must be at most 1024 printable ASCII characters")
    if inst.allocation_id and not ALLOCATION_ID.fullmatch(inst.allocation_id):
        raise InstanceRuleError(f"{field}.allocation_id", f"{inst.allocation_id!r} is not an allocation id")
    if inst.user_data_secret_ref and not secret_refs.NAME_RE.fullmatch(inst.user_data_secret_ref):
        raise InstanceRuleError(
            f"{field}.user_data_secret_ref",
            f"{inst.user_data_secret_ref!r} is not a secret name (1-128 of a-z 0-9 . _ -, starting and ending with a"
            " letter or digit)",
        )
    check_placement(inst, field)
    check_restore(inst, field)
    try:
        disk_rules.check_instance_disks(inst, field)
    except disk_rules.DiskRuleError as e:
        raise InstanceRuleError(e.field, e.why) from None
    try:
        instance_net_rules.check_nics(inst, field)
    except instance_net_rules.NetRuleError as e:
        raise InstanceRuleError(e.field, e.why) from None
    check_gpus(inst, field)


def check_gpus(inst: spec_pb2.Instance, field: str = "instance") -> None:
    """Passthrough GPUs: UUIDs, none twice, at most MAX_GPUS, and an allocation to book them."""
    if not inst.gpus:
        return
    if len(inst.gpus) > MAX_GPUS:
        raise InstanceRuleError(f"{field}.gpus", f"lists {len(inst.gpus)} GPUs, more than {MAX_GPUS}")
    for g in inst.gpus:
        try:
            parse_atom(GPU, g)
        except ValueError:
            raise InstanceRuleError(f"{field}.gpus", f"{g[:80]!r} is not a GPU UUID") from None
    if len(set(inst.gpus)) != len(inst.gpus):
        raise InstanceRuleError(f"{field}.gpus", "names a GPU twice")
    if not inst.allocation_id:
        raise InstanceRuleError(
            f"{field}.gpus",
            "needs the instance's allocation_id: passthrough GPUs are booked by that allocation's BINDING_INSTANCE",
        )


def check_placement(inst: spec_pb2.Instance, field: str = "instance") -> None:
    """Refuse a placement no host could apply: CPUs and NUMA nodes as cpulists (at least as many CPUs as
    vCPUs), a huge page size of 2 MiB or 1 GiB holding the memory in whole pages, and a balloon never with
    huge pages (a balloon cannot give back pinned huge pages). Whether this host has them is the node's check."""
    if not inst.HasField("placement"):
        return
    p, where = inst.placement, f"{field}.placement"
    if p.cpus:
        try:
            cpus = cpulist.parse(p.cpus)
        except ValueError as e:
            raise InstanceRuleError(f"{where}.cpus", str(e)) from None
        if len(cpus) < inst.vcpus:
            raise InstanceRuleError(
                f"{where}.cpus", f"names {len(cpus)} CPUs, fewer than the instance's {inst.vcpus} vCPUs"
            )
    if p.mems:
        try:
            cpulist.parse(p.mems)
        except ValueError as e:
            raise InstanceRuleError(f"{where}.mems", str(e).replace("cpulist", "list of NUMA nodes")) from None
    if p.hugepage_mib:
        if p.hugepage_mib not in HUGEPAGE_SIZES_MIB:
            raise InstanceRuleError(f"{where}.hugepage_mib", f"must be 0, 2 or 1024, not {p.hugepage_mib}")
        if inst.memory_mib % p.hugepage_mib:
            raise InstanceRuleError(
                f"{where}.hugepage_mib", f"{p.hugepage_mib} MiB pages cannot hold {inst.memory_mib} MiB in whole pages"
            )
        if p.balloon:
            raise InstanceRuleError(f"{where}.balloon", "cannot be asked with huge pages")


def check_restore(inst: spec_pb2.Instance, field: str) -> None:
    """`restore_from`: an https URL and the tar's SHA-256; `identity_rebind_ref`: a secret's name, only with it."""
    if inst.HasField("restore_from"):
        rf = inst.restore_from
        if not rf.url.startswith("https://") or len(rf.url) > MAX_URL or not URL_TEXT.fullmatch(rf.url):
            raise InstanceRuleError(
                f"{field}.restore_from.url",
                "must be an https:// URL of at most 2048 printable characters: a snapshot may hold a tenant's memory",
            )
        if not SHA256.fullmatch(rf.sha256):
            raise InstanceRuleError(f"{field}.restore_from.sha256", "must be 64 lowercase hex digits")
    if inst.identity_rebind_ref:
        if not secret_refs.NAME_RE.fullmatch(inst.identity_rebind_ref):
            raise InstanceRuleError(
                f"{field}.identity_rebind_ref", f"{inst.identity_rebind_ref!r} is not a secret name"
            )
        if not inst.HasField("restore_from"):
            raise InstanceRuleError(f"{field}.identity_rebind_ref", "is only for an instance restored from a snapshot")


def check_section(s: spec_pb2.InstancesSection) -> None:
    """Refuse (InstanceRuleError) a section with a bad instance or an id twice; return when it is fine."""
    if len(s.instances) > MAX_INSTANCES:
        raise InstanceRuleError("instances", f"holds {len(s.instances)} instances, more than {MAX_INSTANCES}")
    seen: set[str] = set()
    gpus: dict[str, str] = {}
    for i, inst in enumerate(s.instances):
        field = f"instances[{i}]"
        check_instance(inst, field)
        if inst.id in seen:
            raise InstanceRuleError(f"{field}.id", f"{inst.id!r} appears twice")
        seen.add(inst.id)
        for g in inst.gpus:
            if g in gpus:
                raise InstanceRuleError(f"{field}.gpus", f"GPU {g} is also passed through to instance {gpus[g]}")
            gpus[g] = inst.id
    try:
        disk_rules.check_section_disks(s)
    except disk_rules.DiskRuleError as e:
        raise InstanceRuleError(e.field, e.why) from None
    try:
        instance_net_rules.check_claims(list(s.instances))
    except instance_net_rules.NetRuleError as e:
        raise InstanceRuleError(e.field, e.why) from None
