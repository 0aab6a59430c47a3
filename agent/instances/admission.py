"""Host-side admission: whether this host can give a domain it is about to start its memory.

Pure. The reference's rule (delivery.md, "Instances"): the budget is
`MemTotal` less the huge page pool (`Hugetlb`) and 1 GiB of headroom for the
host; against it count the commitments, not the use, of every running or
paused domain bc manages (its memory plus VMM overhead, 1/32 of the memory
plus 256 MiB), of the bound holds' memory limits, and of the starts admitted
earlier in the same pass. A start that does not fit stays stopped with
`ResourcesExhausted: N MiB needed, M MiB left`: not an error, the converger
tries again on the next pass. A resume from PAUSED is not a start (its
memory is already counted). Not built: the huge page side of the rule (an
instance placement with huge pages), so every domain counts on normal pages.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MIB = 1024 * 1024
HEADROOM_MIB = 1024
OVERHEAD_FIXED_MIB = 256


@dataclass(frozen=True)
class HostMemory:
    """What /proc/meminfo says, in MiB: `MemTotal` and `Hugetlb` (the huge page pool, every size)."""

    total_mib: int
    hugetlb_mib: int = 0

    @property
    def budget_mib(self) -> int:
        return self.total_mib - self.hugetlb_mib - HEADROOM_MIB


def commitment_mib(memory_mib: int) -> int:
    """A domain's charge: its memory plus VMM overhead (1/32 of it, rounded up, plus 256 MiB)."""
    return memory_mib + -(-memory_mib // 32) + OVERHEAD_FIXED_MIB


def holds_mib(memory_bytes: list[int]) -> int:
    """The bound holds' memory limits in MiB (rounded up each)."""
    return sum(-(-b // MIB) for b in memory_bytes if b > 0)


@dataclass
class Admission:
    """One pass's ledger: what is committed now, and each start admitted or refused in turn."""

    host: HostMemory
    committed_mib: int = 0
    admitted: list[str] = field(default_factory=list)

    @classmethod
    def for_pass(cls, host: HostMemory, live_domains_mib: list[int], holds_memory_bytes: list[int]) -> Admission:
        """The ledger at a pass's start: live (running or paused) managed domains and the bound holds."""
        committed = sum(commitment_mib(m) for m in live_domains_mib) + holds_mib(holds_memory_bytes)
        return cls(host, committed)

    @property
    def left_mib(self) -> int:
        return max(0, self.host.budget_mib - self.committed_mib)

    def admit(self, instance_id: str, memory_mib: int) -> str | None:
        """None when the start fits (and is now counted), else the refusal for the instance's status."""
        need = commitment_mib(memory_mib)
        if need > self.host.budget_mib - self.committed_mib:
            return f"ResourcesExhausted: {need} MiB needed, {self.left_mib} MiB left"
        self.committed_mib += need
        self.admitted.append(instance_id)
        return None

    def release(self, memory_mib: int) -> None:
        """A live domain stopped or deleted in this pass gives its commitment back."""
        self.committed_mib = max(0, self.committed_mib - commitment_mib(memory_mib))


def parse_meminfo(text: str) -> HostMemory:
    """`MemTotal` and `Hugetlb` (kB) from /proc/meminfo's text; ValueError without MemTotal."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            values[key.strip()] = int(parts[0])
    if "MemTotal" not in values:
        raise ValueError("/proc/meminfo has no MemTotal")
    return HostMemory(values["MemTotal"] // 1024, values.get("Hugetlb", 0) // 1024)
