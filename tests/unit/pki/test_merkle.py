"""The batch Merkle tree: RFC 6962 roots and audit paths, checked against a recursive reference and known answers."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from bc.pki.merkle import (
    LEAF_PREFIX,
    NODE_PREFIX,
    MerkleTree,
    leaf_bytes,
    leaf_hash,
    merkle_root,
    node_hash,
    payload_digest,
    verify_proof,
)

# --- The reference: RFC 6962 section 2.1 transcribed literally, recursion and all. ---


def _split(n: int) -> int:
    """The largest power of two smaller than n (n > 1)."""
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def ref_mth(d: Sequence[bytes]) -> bytes:
    """MTH(D[n]) for n >= 1."""
    if len(d) == 1:
        return hashlib.sha256(b"\x00" + d[0]).digest()
    k = _split(len(d))
    return hashlib.sha256(b"\x01" + ref_mth(d[:k]) + ref_mth(d[k:])).digest()


def ref_path(m: int, d: Sequence[bytes]) -> list[bytes]:
    """PATH(m, D[n])."""
    if len(d) == 1:
        return []
    k = _split(len(d))
    if m < k:
        return [*ref_path(m, d[:k]), ref_mth(d[k:])]
    return [*ref_path(m - k, d[k:]), ref_mth(d[:k])]


def verify_from_hash(h: bytes, index: int, size: int, path: Sequence[bytes], root: bytes) -> bool:
    """RFC 9162's check started from a given hash instead of a leaf (to show an interior node's path is real)."""
    fn, sn, r = index, size - 1, h
    for p in path:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            while fn and not fn & 1:
                fn, sn = fn >> 1, sn >> 1
        else:
            r = node_hash(r, p)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and r == root


def digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


leaf_lists = st.lists(st.binary(max_size=48), min_size=1, max_size=300)

# --- Known answers. ---

# The three-leaf batch of the brief, its root computed once by `ref_mth` above. If this changes, the
# encoding changed, and every signed batch scope with it: that is a protocol change, never a refactor.
KAT_LEAVES = [
    leaf_bytes("n1", "gpu.reset", digest(b"a")),
    leaf_bytes("n2", "gpu.reset", digest(b"b")),
    leaf_bytes("n3", "gpu.reset", digest(b"c")),
]
KAT_ROOT = "0f3ba24fcaff87f41e20478f6c23cb67fe0f0b3e8d4548cae747b4a9371766cc"

# Certificate Transparency's reference vectors (RFC 6962 test data, as in certificate-transparency's
# merkle_tree_test): the roots of the first n of these eight leaves, and three audit paths.
CT_LEAVES = [
    bytes.fromhex(h)
    for h in ("", "00", "10", "2021", "3031", "40414243", "5051525354555657", "606162636465666768696a6b6c6d6e6f")
]
CT_ROOTS = [
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
]
CT_PATHS = [  # (index, tree size, path)
    (
        0,
        8,
        [
            "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
        ],
    ),
    (
        5,
        8,
        [
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        ],
    ),
    (2, 3, ["fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125"]),
    (
        1,
        5,
        [
            "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
        ],
    ),
]


def test_known_answer_root_of_three_leaves() -> None:
    assert KAT_LEAVES[0] == (
        b"bc.v1/batch-leaf\nn1\ngpu.reset\nca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb"
    )
    assert merkle_root(KAT_LEAVES).hex() == KAT_ROOT
    assert MerkleTree(KAT_LEAVES).root.hex() == KAT_ROOT
    assert ref_mth(KAT_LEAVES).hex() == KAT_ROOT


def test_certificate_transparency_vectors() -> None:
    for n in range(1, len(CT_LEAVES) + 1):
        assert merkle_root(CT_LEAVES[:n]).hex() == CT_ROOTS[n - 1]
        assert MerkleTree(CT_LEAVES[:n]).root.hex() == CT_ROOTS[n - 1]
    for index, size, path in CT_PATHS:
        tree = MerkleTree(CT_LEAVES[:size])
        assert [p.hex() for p in tree.proof(index)] == path
        assert verify_proof(CT_LEAVES[index], index, size, [bytes.fromhex(p) for p in path], tree.root)


# --- Encoding. ---


def test_payload_digest() -> None:
    url = "type.googleapis.com/bc.v1.GpuResetRequest"
    assert payload_digest(url, b"\x08\x01") == digest(url.encode() + b"\n\x08\x01")
    assert payload_digest(url, b"") == digest(url.encode() + b"\n")
    assert payload_digest(url + "x", b"") != payload_digest(url, b"x")
    with pytest.raises(ValueError):
        payload_digest("a\nb", b"")


def test_leaf_bytes_encoding() -> None:
    d = bytes(range(32))
    assert leaf_bytes("node-7", "gpu.reset", d) == b"bc.v1/batch-leaf\nnode-7\ngpu.reset\n" + d.hex().encode()
    assert leaf_bytes("nœud", "k", d) == "bc.v1/batch-leaf\nnœud\nk\n".encode() + d.hex().encode()


@pytest.mark.parametrize(
    ("node_id", "kind", "d"),
    [
        ("n1\n", "gpu.reset", bytes(32)),
        ("n1", "gpu\n.reset", bytes(32)),
        ("\n", "\n", bytes(32)),
        ("n1", "gpu.reset", bytes(31)),
        ("n1", "gpu.reset", bytes(33)),
        ("n1", "gpu.reset", b""),
        ("n1", "gpu.reset", bytes(32).hex().encode()),
    ],
)
def test_leaf_bytes_refuses_ambiguous_input(node_id: str, kind: str, d: bytes) -> None:
    with pytest.raises(ValueError):
        leaf_bytes(node_id, kind, d)


def test_hash_primitives() -> None:
    assert LEAF_PREFIX == b"\x00" and NODE_PREFIX == b"\x01"
    assert leaf_hash(b"x") == digest(b"\x00x")
    assert node_hash(b"l" * 32, b"r" * 32) == digest(b"\x01" + b"l" * 32 + b"r" * 32)


# --- Shape and the reference. ---


def test_one_leaf() -> None:
    leaf = leaf_bytes("n1", "gpu.reset", digest(b"a"))
    tree = MerkleTree([leaf])
    assert len(tree) == 1
    assert tree.root == leaf_hash(leaf) == merkle_root([leaf])
    assert tree.proof(0) == []
    assert verify_proof(leaf, 0, 1, [], tree.root)
    assert not verify_proof(leaf, 0, 1, [tree.root], tree.root)
    assert not verify_proof(leaf, 0, 2, [], tree.root)


def test_empty_is_refused() -> None:
    with pytest.raises(ValueError):
        MerkleTree([])
    with pytest.raises(ValueError):
        merkle_root([])


def test_proof_index_out_of_range() -> None:
    tree = MerkleTree([b"a", b"b", b"c"])
    for bad in (-1, 3, 4, 10**9):
        with pytest.raises(IndexError):
            tree.proof(bad)


def test_matches_reference_for_every_size_to_300() -> None:
    """The bottom-up build with carried odd nodes is RFC 6962's split at the largest power of two."""
    leaves = [f"leaf-{i}".encode() for i in range(300)]
    for n in range(1, 301):
        assert merkle_root(leaves[:n]) == ref_mth(leaves[:n]), n


def test_paths_match_reference_for_every_leaf_of_every_size_to_70() -> None:
    leaves = [f"leaf-{i}".encode() for i in range(70)]
    for n in range(1, 71):
        tree = MerkleTree(leaves[:n])
        assert tree.root == ref_mth(leaves[:n])
        for m in range(n):
            path = tree.proof(m)
            assert path == ref_path(m, leaves[:n]), (m, n)
            assert len(path) <= (n - 1).bit_length()
            assert verify_proof(leaves[m], m, n, path, tree.root)


@pytest.mark.parametrize("n", [2**k + d for k in range(1, 11) for d in (-1, 0, 1)])
def test_power_of_two_boundaries(n: int) -> None:
    leaves = [i.to_bytes(4, "big") for i in range(n)]
    tree = MerkleTree(leaves)
    assert tree.root == ref_mth(leaves)
    for m in {0, 1, n // 2, n - 2, n - 1}:
        if 0 <= m < n:
            assert tree.proof(m) == ref_path(m, leaves)
            assert verify_proof(leaves[m], m, n, tree.proof(m), tree.root)


def test_large_tree_proofs_are_logarithmic() -> None:
    n = 100_001
    leaves = [i.to_bytes(4, "big") for i in range(n)]
    tree = MerkleTree(leaves)
    assert len(tree) == n
    rng = random.Random(6962)
    for m in [0, n - 1, n - 2, 2**16, 2**16 - 1, *rng.sample(range(n), 50)]:
        path = tree.proof(m)
        assert len(path) <= 17
        assert verify_proof(leaves[m], m, n, path, tree.root)
    assert tree.root == merkle_root(leaves)


@given(leaf_lists)
@settings(max_examples=60, deadline=None)
def test_matches_reference(leaves: list[bytes]) -> None:
    assert merkle_root(leaves) == ref_mth(leaves) == MerkleTree(leaves).root


# --- Properties. ---


@given(leaf_lists)
@settings(max_examples=100, deadline=None)
def test_every_proof_verifies(leaves: list[bytes]) -> None:
    tree = MerkleTree(leaves)
    n = len(leaves)
    assert len(tree) == n
    for m in range(n):
        assert verify_proof(leaves[m], m, n, tree.proof(m), tree.root)


@given(st.lists(st.binary(max_size=16), min_size=1, max_size=40, unique=True), st.binary(max_size=20))
@settings(max_examples=100, deadline=None)
def test_a_leaf_not_in_the_tree_never_verifies(leaves: list[bytes], stranger: bytes) -> None:
    assume(stranger not in leaves)
    tree = MerkleTree(leaves)
    n = len(leaves)
    proofs = [tree.proof(m) for m in range(n)]
    for index in range(n):
        for path in proofs:
            assert not verify_proof(stranger, index, n, path, tree.root)


@given(st.lists(st.binary(max_size=16), min_size=2, max_size=64, unique=True), st.data())
@settings(max_examples=100, deadline=None)
def test_a_proof_does_not_verify_at_another_index(leaves: list[bytes], data: st.DataObject) -> None:
    tree = MerkleTree(leaves)
    n = len(leaves)
    i = data.draw(st.integers(0, n - 1))
    path = tree.proof(i)
    for j in range(n):
        assert verify_proof(leaves[i], j, n, path, tree.root) is (j == i)


def test_the_path_does_not_bind_the_tree_size() -> None:
    """RFC 6962 as designed: leaf 0's path in a tree of 3 also checks as leaf 0 of 4 (the right half is opaque).

    So the size is not proven by a path: whoever signs the root signs the tree size with it.
    """
    leaves = [b"a", b"b", b"c"]
    tree = MerkleTree(leaves)
    assert verify_proof(b"a", 0, 3, tree.proof(0), tree.root)
    assert verify_proof(b"a", 0, 4, tree.proof(0), tree.root)
    assert not verify_proof(b"a", 0, 2, tree.proof(0), tree.root)
    assert not verify_proof(b"c", 2, 4, tree.proof(2), tree.root)


@given(leaf_lists, st.data())
@settings(max_examples=100, deadline=None)
def test_changing_any_leaf_changes_the_root(leaves: list[bytes], data: st.DataObject) -> None:
    i = data.draw(st.integers(0, len(leaves) - 1))
    other = data.draw(st.binary(max_size=48).filter(lambda b: b != leaves[i]))
    changed = [*leaves[:i], other, *leaves[i + 1 :]]
    assert merkle_root(changed) != merkle_root(leaves)


@given(st.lists(st.binary(max_size=16), min_size=2, max_size=100, unique=True), st.data())
@settings(max_examples=100, deadline=None)
def test_reordering_changes_the_root(leaves: list[bytes], data: st.DataObject) -> None:
    shuffled = data.draw(st.permutations(leaves))
    assume(shuffled != leaves)
    assert merkle_root(shuffled) != merkle_root(leaves)


def test_swapping_two_neighbours_changes_the_root() -> None:
    leaves = [f"leaf-{i}".encode() for i in range(17)]
    for i in range(16):
        swapped = [*leaves[:i], leaves[i + 1], leaves[i], *leaves[i + 2 :]]
        assert merkle_root(swapped) != merkle_root(leaves)


@given(leaf_lists, st.binary(max_size=48))
@settings(max_examples=100, deadline=None)
def test_adding_a_leaf_changes_the_root(leaves: list[bytes], extra: bytes) -> None:
    assert merkle_root([*leaves, extra]) != merkle_root(leaves)
    assert merkle_root([extra, *leaves]) != merkle_root(leaves)


def test_duplicating_the_last_leaf_changes_the_root() -> None:
    """No Bitcoin-style padding: [a, b, c] and [a, b, c, c] have different roots."""
    for n in range(1, 40):
        leaves = [f"leaf-{i}".encode() for i in range(n)]
        assert merkle_root([*leaves, leaves[-1]]) != merkle_root(leaves)


# --- Second preimage: a leaf is never an interior node. ---


def test_an_interior_node_cannot_pass_as_a_leaf() -> None:
    leaves = [f"leaf-{i}".encode() for i in range(8)]
    tree = MerkleTree(leaves)
    full_path = tree.proof(0)
    left, right = leaf_hash(leaves[0]), leaf_hash(leaves[1])
    forged = left + right  # 64 bytes: the preimage of the node over leaves 0 and 1, minus its prefix
    assert len(forged) == 64
    # The node (index 0 of the 4 nodes one level up) and the rest of leaf 0's path do reach the root ...
    assert verify_from_hash(node_hash(left, right), 0, 4, full_path[1:], tree.root)
    # ... but the same bytes offered as a leaf hash with the 0x00 prefix, so they never make that node.
    assert leaf_hash(forged) != node_hash(left, right)
    assert not verify_proof(forged, 0, 4, full_path[1:], tree.root)
    assert not verify_proof(forged, 0, 8, full_path, tree.root)
    for i in range(8):
        for size in range(1, 9):
            for m in range(8):
                assert not verify_proof(forged, i, size, tree.proof(m), tree.root)


@given(st.lists(st.binary(max_size=16), min_size=2, max_size=64), st.data())
@settings(max_examples=100, deadline=None)
def test_no_interior_node_verifies_as_a_leaf(leaves: list[bytes], data: st.DataObject) -> None:
    """Any interior node's children, concatenated, do not verify as a leaf at the node's position."""
    n = len(leaves)
    tree = MerkleTree(leaves)
    i = data.draw(st.integers(0, n // 2 - 1))
    left, right = leaf_hash(leaves[2 * i]), leaf_hash(leaves[2 * i + 1])
    up = (n + 1) // 2  # the bottom pairs are interior nodes of a tree of `up` "leaves" one level up
    path = tree.proof(2 * i)[1:]
    assert verify_from_hash(node_hash(left, right), i, up, path, tree.root)
    assert not verify_proof(left + right, i, up, path, tree.root)


# --- Malformed input: False, never an exception. ---


def _good() -> tuple[list[bytes], MerkleTree]:
    leaves = [f"leaf-{i}".encode() for i in range(11)]
    return leaves, MerkleTree(leaves)


def test_malformed_inputs_return_false() -> None:
    leaves, tree = _good()
    n, m = len(leaves), 5
    leaf, path, root = leaves[m], tree.proof(m), tree.root
    assert verify_proof(leaf, m, n, path, root)
    cases: list[tuple[object, object, object, object, object]] = [
        (leaf, -1, n, path, root),
        (leaf, n, n, path, root),
        (leaf, n + 5, n, path, root),
        (leaf, m, 0, path, root),
        (leaf, m, -n, path, root),
        (leaf, 0, 0, [], root),
        (leaf, m, n, path[:-1], root),
        (leaf, m, n, [*path, path[-1]], root),
        (leaf, m, n, [*path, root, root, root], root),
        (leaf, m, n, [], root),
        (leaf, m, n, [p[:31] for p in path], root),
        (leaf, m, n, [*path[:-1], path[-1] + b"\x00"], root),
        (leaf, m, n, [*path[:-1], b""], root),
        (leaf, m, n, path, root[:31]),
        (leaf, m, n, path, root + b"\x00"),
        (leaf, m, n, path, b""),
        (leaf, m, n, path, root.hex()),
        (leaf, m, n, [p.hex() for p in path], root),
        (leaf, m, n, [None, *path[1:]], root),
        (leaf, m, n, b"".join(path), root),
        (leaf, m, n, None, root),
        (leaf, m, n, 42, root),
        (leaf.decode(), m, n, path, root),
        (None, m, n, path, root),
        (leaf, str(m), n, path, root),
        (leaf, float(m), n, path, root),
        (leaf, m, float(n), path, root),
        (leaf, None, n, path, root),
        (leaf, m, None, path, root),
        (leaf, True, n, path, root),
        (leaf, m, 10**400, path, root),
        (leaf, 10**400, 10**401, path, root),
    ]
    for case in cases:
        assert verify_proof(*case) is False, case  # type: ignore[arg-type]


@given(
    st.binary(max_size=64),
    st.integers(-(2**70), 2**70),
    st.integers(-(2**70), 2**70),
    st.lists(st.binary(min_size=0, max_size=40), max_size=80),
    st.binary(min_size=0, max_size=40),
)
@settings(max_examples=300, deadline=None)
def test_garbage_never_raises(leaf: bytes, index: int, size: int, path: list[bytes], root: bytes) -> None:
    assert verify_proof(leaf, index, size, path, root) in (True, False)


def test_a_tampered_path_does_not_verify() -> None:
    leaves, tree = _good()
    n = len(leaves)
    for m in range(n):
        path = tree.proof(m)
        for k in range(len(path)):
            flipped = bytes([path[k][0] ^ 1]) + path[k][1:]
            assert not verify_proof(leaves[m], m, n, [*path[:k], flipped, *path[k + 1 :]], tree.root)
        if len(path) > 1:
            assert not verify_proof(leaves[m], m, n, path[::-1], tree.root)
        assert not verify_proof(leaves[m], m, n, path, bytes([tree.root[0] ^ 1]) + tree.root[1:])


def test_accepts_bytearray_hashes() -> None:
    leaves, tree = _good()
    path = [bytearray(p) for p in tree.proof(3)]
    assert verify_proof(bytearray(leaves[3]), 3, len(leaves), path, bytearray(tree.root))  # type: ignore[arg-type]
