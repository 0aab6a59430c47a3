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
* `runtime` is one this release builds (`qemu`); vCPUs and memory are in range.
* The guest boots its kernel directly: `kernel` (and `initrd`) are file names in
  the node's `<data-dir>/instance-boot/`, never paths, so a spec cannot point
  a VM at an arbitrary host file. `cmdline` is printable ASCII.
* `user_data_secret_ref`, when set, is a secret's name (bc.protocol.secret_refs): the node asks the
  broker for it, bound to the instances section, and hands the guest its value at start.
* What is not built yet is refused rather than silently ignored: a tenant
  `image`, `nics` and passthrough `gpus`.
"""

from __future__ import annotations

import re
from typing import Final

from bc.protocol import secret_refs
from bc.protocol.pb import spec_pb2

RUNNING: Final = "RUNNING"
PAUSED: Final = "PAUSED"
STOPPED: Final = "STOPPED"
DELETED: Final = "DELETED"
DESIRED_STATES: tuple[str, ...] = (RUNNING, PAUSED, STOPPED, DELETED)

RUNTIMES: tuple[str, ...] = ("qemu",)
"""The runtimes this release builds (the fake runtime of `--fake-hw` answers as `qemu`)."""

INSTANCE_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
BOOT_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")
ALLOCATION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
SIZE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
CMDLINE = re.compile(r"[\x20-\x7e]{0,1024}")

MAX_VCPUS = 256
MIN_MEMORY_MIB = 16
MAX_MEMORY_MIB = 4 * 1024 * 1024
MAX_INSTANCES = 256


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
    if not BOOT_FILE.fullmatch(inst.kernel):
        raise InstanceRuleError(f"{field}.kernel", f"{inst.kernel!r} is not a file name in the node's instance-boot/")
    if inst.initrd and not BOOT_FILE.fullmatch(inst.initrd):
        raise InstanceRuleError(f"{field}.initrd", f"{inst.initrd!r} is not a file name in the node's instance-boot/")
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
    if inst.image:
        raise InstanceRuleError(f"{field}.image", "is refused: tenant images are not built yet (boot a kernel)")
    if inst.nics:
        raise InstanceRuleError(f"{field}.nics", "is refused: instance networks are not built yet")
    if inst.gpus:
        raise InstanceRuleError(f"{field}.gpus", "is refused: GPU passthrough (VFIO) is not built yet")


def check_section(s: spec_pb2.InstancesSection) -> None:
    """Refuse (InstanceRuleError) a section with a bad instance or an id twice; return when it is fine."""
    if len(s.instances) > MAX_INSTANCES:
        raise InstanceRuleError("instances", f"holds {len(s.instances)} instances, more than {MAX_INSTANCES}")
    seen: set[str] = set()
    for i, inst in enumerate(s.instances):
        field = f"instances[{i}]"
        check_instance(inst, field)
        if inst.id in seen:
            raise InstanceRuleError(f"{field}.id", f"{inst.id!r} appears twice")
        seen.add(inst.id)
