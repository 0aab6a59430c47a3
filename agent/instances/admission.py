"""Host-side admission: whether this host can give a domain it is about to start its memory.

Pure. The reference's rule (delivery.md, "Instances"): the budget is
`MemTotal` less the huge page pool (`Hugetlb`) and 1 GiB of headroom for the
host; against it count the commitments, not the use, of every running or
paused domain bc manages (its memory plus VMM overhead, 1/32 of the memory
plus 256 MiB), of the bound holds' memory limits, and of the starts admitted
earlier in the same pass. A start that does not fit stays stopped with
`ResourcesExhausted: N MiB needed, M MiB left`: not an error, the converger
tries again on the next pass. A resume from PAUSED is not a start (its
memory is already counted).

Huge pages, for an instance whose placement asks for them: its memory must fit
in free pages of that size on the placement's NUMA nodes, and in no more than
the host-wide count (free less reserved, less what starts of this pass
took); without NUMA nodes, the host-wide count alone. Its VMM overhead still
counts against normal memory, its memory does not. Running guests' pages are
already gone from the free counts, so only this pass's starts are subtracted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.instances.placement import HugePages

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


def commitment_mib(memory_mib: int, hugepage_mib: int = 0) -> int:
    """A domain's charge on normal memory: its memory plus VMM overhead (1/32 of it, rounded up, plus 256 MiB);
    the overhead alone when its memory is in huge pages."""
    overhead = -(-memory_mib // 32) + OVERHEAD_FIXED_MIB
    return overhead if hugepage_mib else memory_mib + overhead


def holds_mib(memory_bytes: list[int]) -> int:
    """The bound holds' memory limits in MiB (rounded up each)."""
    return sum(-(-b // MIB) for b in memory_bytes if b > 0)


@dataclass
class Admission:
    """One pass's ledger: what is committed now, and each start admitted or refused in turn."""

    host: HostMemory
    committed_mib: int = 0
    admitted: list[str] = field(default_factory=list)
    hugepages: dict[int, HugePages] = field(default_factory=dict)
    """This host's pools by page size (MiB), as read at the pass's start."""
    taken: list[tuple[int, frozenset[int], int]] = field(default_factory=list)
    """Pages this pass's starts took: (page size, their NUMA nodes, pages)."""

    @classmethod
    def for_pass(
        cls,
        host: HostMemory,
        live_domains_mib: list[int] | list[tuple[int, int]],
        holds_memory_bytes: list[int],
        hugepages: dict[int, HugePages] | None = None,
    ) -> Admission:
        """The ledger at a pass's start: live (running or paused) managed domains (memory, or (memory, huge page
        size)) and the bound holds."""
        committed = holds_mib(holds_memory_bytes)
        for d in live_domains_mib:
            committed += commitment_mib(*d) if isinstance(d, tuple) else commitment_mib(d)
        return cls(host, committed, hugepages=dict(hugepages or {}))

    def pages_free(self, size_mib: int, mems: tuple[int, ...] = ()) -> int:
        """Free pages of this size a start may take now: on its NUMA nodes (when it names any), never more than
        host-wide free less reserved, less what this pass's starts took."""
        pool = self.hugepages.get(size_mib)
        if pool is None:
            return 0
        host_free = pool.free - pool.reserved - sum(n for s, _, n in self.taken if s == size_mib)
        if not mems:
            return max(0, host_free)
        on_nodes = sum(pool.free_by_node.get(m, 0) for m in mems)
        on_nodes -= sum(n for s, nodes, n in self.taken if s == size_mib and nodes & set(mems))
        return max(0, min(host_free, on_nodes))

    @property
    def left_mib(self) -> int:
        return max(0, self.host.budget_mib - self.committed_mib)

    def admit(self, instance_id: str, memory_mib: int, hugepage_mib: int = 0, mems: tuple[int, ...] = ()) -> str | None:
        """None when the start fits (and is now counted), else the refusal for the instance's status."""
        need = commitment_mib(memory_mib, hugepage_mib)
        if need > self.host.budget_mib - self.committed_mib:
            return f"ResourcesExhausted: {need} MiB needed, {self.left_mib} MiB left"
        if hugepage_mib:
            pages = memory_mib // hugepage_mib
            free = self.pages_free(hugepage_mib, mems)
            if pages > free:
                where = f" on NUMA nodes {','.join(map(str, mems))}" if mems else ""
                return f"ResourcesExhausted: {pages} huge pages of {hugepage_mib} MiB needed, {free} free{where}"
            self.taken.append((hugepage_mib, frozenset(mems), pages))
        self.committed_mib += need
        self.admitted.append(instance_id)
        return None

    def release(self, memory_mib: int, hugepage_mib: int = 0, mems: tuple[int, ...] = ()) -> None:
        """A start that failed gives back what it was admitted with."""
        self.committed_mib = max(0, self.committed_mib - commitment_mib(memory_mib, hugepage_mib))
        if hugepage_mib:
            entry = (hugepage_mib, frozenset(mems), memory_mib // hugepage_mib)
            if entry in self.taken:
                self.taken.remove(entry)


def meminfo_kb(text: str) -> dict[str, int]:
    """/proc/meminfo's text as numbers (kB for the sizes, counts for the huge page lines)."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            values[key.strip()] = int(parts[0])
    return values


def parse_meminfo(text: str) -> HostMemory:
    """`MemTotal` and `Hugetlb` (kB) from /proc/meminfo's text; ValueError without MemTotal."""
    values = meminfo_kb(text)
    if "MemTotal" not in values:
        raise ValueError("/proc/meminfo has no MemTotal")
    return HostMemory(values["MemTotal"] // 1024, values.get("Hugetlb", 0) // 1024)
