"""Batch-scope Merkle tree figures (`bc.pki.merkle`): build, proof size, proof verification.

For batches of 10, 1,000 and 100,000 leaves (real `leaf_bytes`: a node id,
`gpu.reset`, a payload digest), printed, never asserted:

* build: `MerkleTree(leaves)` wall time, the leaves already encoded (median of
  several builds; O(n), so it grows with n);
* proof size: hashes and bytes of every leaf's audit path (min / max; RFC 6962
  paths differ by at most one level from leaf to leaf), next to ⌈log2 n⌉;
* proof: `tree.proof(i)` and `verify_proof(leaf, i, n, path, root)`, each call
  timed alone (`time.perf_counter_ns`) for random leaves after a warm-up,
  median and p99 in µs, next to log2(n): both grow as log n, not n.

Usage: python -m bench.run --only merkle   (or python -m bench.merkle)
"""

from __future__ import annotations

import hashlib
import math
import random
import statistics
import time

from bc.pki.merkle import HASH_SIZE, MerkleTree, leaf_bytes, payload_digest, verify_proof

SIZES = (10, 1_000, 100_000)
VERIFICATIONS = 20_000
WARMUP = 1_000


def batch_leaves(n: int) -> list[bytes]:
    digest = payload_digest("type.googleapis.com/bc.v1.GpuResetRequest", b"\x08\x01")
    return [
        leaf_bytes(f"node-{i:06d}", "gpu.reset", hashlib.sha256(digest + i.to_bytes(4, "big")).digest())
        for i in range(n)
    ]


def _median_p99_us(samples_ns: list[int]) -> tuple[float, float]:
    samples_ns.sort()
    return statistics.median(samples_ns) / 1000, samples_ns[
        min(len(samples_ns) - 1, int(len(samples_ns) * 0.99))
    ] / 1000


def figures(n: int, rng: random.Random) -> dict[str, float]:
    leaves = batch_leaves(n)
    builds = max(3, min(200, 200_000 // n))
    build_ns: list[int] = []
    tree = MerkleTree(leaves)
    for _ in range(builds):
        t0 = time.perf_counter_ns()
        tree = MerkleTree(leaves)
        build_ns.append(time.perf_counter_ns() - t0)
    lengths = [len(tree.proof(i)) for i in range(n)]
    root = tree.root

    picks = [rng.randrange(n) for _ in range(WARMUP + VERIFICATIONS)]
    proofs = [tree.proof(i) for i in picks]
    for i, path in zip(picks[:WARMUP], proofs[:WARMUP], strict=True):
        tree.proof(i)
        verify_proof(leaves[i], i, n, path, root)
    prove_ns: list[int] = []
    verify_ns: list[int] = []
    for i, path in zip(picks[WARMUP:], proofs[WARMUP:], strict=True):
        leaf = leaves[i]
        t0 = time.perf_counter_ns()
        tree.proof(i)
        t1 = time.perf_counter_ns()
        ok = verify_proof(leaf, i, n, path, root)
        t2 = time.perf_counter_ns()
        if not ok:
            raise AssertionError(f"leaf {i} of {n} does not verify")
        prove_ns.append(t1 - t0)
        verify_ns.append(t2 - t1)
    prove_med, prove_p99 = _median_p99_us(prove_ns)
    verify_med, verify_p99 = _median_p99_us(verify_ns)
    return {
        "leaves": n,
        "log2_n": math.log2(n),
        "build_ms": statistics.median(build_ns) / 1e6,
        "builds": builds,
        "path_min": min(lengths),
        "path_max": max(lengths),
        "path_mean": statistics.fmean(lengths),
        "prove_median_us": prove_med,
        "prove_p99_us": prove_p99,
        "verify_median_us": verify_med,
        "verify_p99_us": verify_p99,
    }


def run() -> None:
    rng = random.Random(6962)
    rows = [figures(n, rng) for n in SIZES]
    print(
        f"batch Merkle tree (RFC 6962, SHA-256): build median of several; proof and verify of {VERIFICATIONS}"
        " random leaves each, µs"
    )
    print(
        f"  {'leaves':>8}  {'build ms':>9}  {'path hashes':>11}  {'path bytes':>10}  {'log2 n':>6}"
        f"  {'proof med':>9}  {'verify med':>10}  {'verify p99':>10}  {'verify/log2 n':>13}"
    )
    for r in rows:
        hashes = f"{r['path_min']:.0f}-{r['path_max']:.0f}"
        nbytes = f"{r['path_min'] * HASH_SIZE:.0f}-{r['path_max'] * HASH_SIZE:.0f}"
        print(
            f"  {r['leaves']:>8,.0f}  {r['build_ms']:>9.3f}  {hashes:>11}  {nbytes:>10}  {r['log2_n']:>6.2f}"
            f"  {r['prove_median_us']:>9.2f}  {r['verify_median_us']:>10.2f}  {r['verify_p99_us']:>10.2f}"
            f"  {r['verify_median_us'] / r['log2_n']:>13.2f}"
        )
    first, last = rows[0], rows[-1]
    print(
        f"  {last['leaves'] / first['leaves']:,.0f}x the leaves: build x{last['build_ms'] / first['build_ms']:,.0f},"
        f" verify x{last['verify_median_us'] / first['verify_median_us']:.1f}"
        f" (log2 n x{last['log2_n'] / first['log2_n']:.1f}, longest path x{last['path_max'] / first['path_max']:.1f})",
        flush=True,
    )


if __name__ == "__main__":
    run()
