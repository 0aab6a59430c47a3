"""The Merkle tree over a destructive batch's leaves: one root a quorum signs, one audit path per node.

A destructive batch (many nodes, one kind, one payload each) is approved once:
the quorum signs the root of a Merkle tree whose leaves are the batch's
commands, and each node receives its own leaf and an O(log n) audit path, so it
can check that its command is in the approved scope without seeing the rest.

Canonical encoding (see also docs/quorum.md, "Scope encoding"). Everything
below is SHA-256; "+" is byte concatenation; strings are UTF-8.

1. Payload digest, the digest of a command's `google.protobuf.Any` payload:

       payload_digest = SHA-256(type_url + b"\\n" + value)

   `type_url` must not contain "\\n" (no protobuf type URL does), so the split
   between the two is unambiguous; `value` is the Any's serialized bytes as
   stored (the deterministic serialization), taken as is.

2. Leaf, one per command:

       leaf = b"bc.v1/batch-leaf\\n" + node_id + b"\\n" + kind + b"\\n" + hex(payload_digest)

   `hex` is 64 lowercase hex digits. `node_id` and `kind` must not contain
   "\\n" and the digest is exactly 32 bytes, so a leaf decodes one way only.
   The leading tag domain-separates these bytes from anything else bc hashes
   or signs.

3. Tree, RFC 6962 section 2.1 (Certificate Transparency; RFC 9162 section
   2.1.1 is the same hash), over the leaves in batch order D[0:n], n >= 1:

       MTH({d})   = SHA-256(0x00 + d)                          leaf hash
       MTH(D[n])  = SHA-256(0x01 + MTH(D[0:k]) + MTH(D[k:n]))  node hash, n > 1,
                    k the largest power of two smaller than n

   The 0x00 / 0x01 prefixes keep a leaf from ever hashing like an interior
   node (a 64-byte leaf equal to left + right of a node does not hash to that
   node), which closes the classic second-preimage attack on Merkle trees. Any
   n works; no padding leaves, no duplicated last node. The empty tree has no
   root here (a batch has at least one command).

4. Audit path, RFC 6962 section 2.1.1 PATH(m, D[n]): the sibling hashes from
   the leaf up to the root, nearest first, at most ceil(log2 n) of 32 bytes
   each. It is checked with the algorithm of RFC 9162 section 2.1.3.2 given
   the leaf, its index m and the tree size n (`verify_proof`).

`MerkleTree` builds bottom-up, pairing neighbours level by level and carrying
an odd last node up unchanged; that gives exactly MTH (the split at the largest
power of two is where the carried node lands), builds in O(n) and keeps every
level, so a proof is O(log n) look-ups.

Pure: no I/O, only `hashlib`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

__all__ = [
    "HASH_SIZE",
    "LEAF_PREFIX",
    "LEAF_TAG",
    "NODE_PREFIX",
    "MerkleTree",
    "leaf_bytes",
    "leaf_hash",
    "merkle_root",
    "node_hash",
    "payload_digest",
    "verify_proof",
]

LEAF_PREFIX = b"\x00"
NODE_PREFIX = b"\x01"
LEAF_TAG = b"bc.v1/batch-leaf\n"
HASH_SIZE = 32


def payload_digest(type_url: str, value: bytes) -> bytes:
    """sha256(type_url utf-8 + b"\\n" + value): the digest of a command's google.protobuf.Any payload.

    ValueError when `type_url` contains "\\n" (it would make the encoding ambiguous).
    """
    if "\n" in type_url:
        raise ValueError("a payload type URL cannot contain a newline")
    return hashlib.sha256(type_url.encode("utf-8") + b"\n" + bytes(value)).digest()


def leaf_bytes(node_id: str, kind: str, payload_digest: bytes) -> bytes:
    """b"bc.v1/batch-leaf\\n" + node_id + b"\\n" + kind + b"\\n" + payload_digest.hex()  (utf-8).

    ValueError for a node_id or kind containing "\\n", or a digest that is not 32 bytes.
    """
    if "\n" in node_id:
        raise ValueError(f"a batch leaf's node id cannot contain a newline: {node_id!r}")
    if "\n" in kind:
        raise ValueError(f"a batch leaf's kind cannot contain a newline: {kind!r}")
    if not isinstance(payload_digest, bytes | bytearray) or len(payload_digest) != HASH_SIZE:
        raise ValueError(f"a batch leaf's payload digest must be {HASH_SIZE} bytes")
    return LEAF_TAG + f"{node_id}\n{kind}\n{bytes(payload_digest).hex()}".encode()


def leaf_hash(leaf: bytes) -> bytes:
    """sha256(LEAF_PREFIX + leaf): RFC 6962's hash of one leaf."""
    return hashlib.sha256(LEAF_PREFIX + leaf).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """sha256(NODE_PREFIX + left + right): RFC 6962's hash of an interior node."""
    return hashlib.sha256(NODE_PREFIX + left + right).digest()


def _next_level(level: list[bytes]) -> list[bytes]:
    """Hash neighbours pairwise; an odd last node goes up unchanged (it is the right subtree of the RFC's split)."""
    sha256 = hashlib.sha256
    up = [sha256(NODE_PREFIX + level[i] + level[i + 1]).digest() for i in range(0, len(level) - 1, 2)]
    if len(level) % 2:
        up.append(level[-1])
    return up


def _leaf_level(leaves: Sequence[bytes]) -> list[bytes]:
    if len(leaves) == 0:
        raise ValueError("a Merkle tree needs at least one leaf")
    sha256 = hashlib.sha256
    return [sha256(LEAF_PREFIX + leaf).digest() for leaf in leaves]


class MerkleTree:
    """An RFC 6962 Merkle tree over `leaves` (each a `leaf_bytes`), in their order, with every level kept."""

    __slots__ = ("_levels",)

    def __init__(self, leaves: Sequence[bytes]) -> None:
        """O(n). ValueError when `leaves` is empty."""
        level = _leaf_level(leaves)
        levels = [level]
        while len(level) > 1:
            level = _next_level(level)
            levels.append(level)
        self._levels: tuple[list[bytes], ...] = tuple(levels)

    @property
    def root(self) -> bytes:
        """MTH(D[n]), 32 bytes."""
        return self._levels[-1][0]

    def __len__(self) -> int:
        return len(self._levels[0])

    def proof(self, index: int) -> list[bytes]:
        """PATH(index, D[n]): the audit path of leaf `index`, nearest sibling first. IndexError when out of range."""
        n = len(self._levels[0])
        if not 0 <= index < n:
            raise IndexError(f"leaf index {index} is out of range for a tree of {n} leaves")
        path: list[bytes] = []
        for level in self._levels[:-1]:
            sibling = index ^ 1
            if sibling < len(level):  # else: the odd last node, carried up with no sibling at this level
                path.append(level[sibling])
            index >>= 1
        return path


def merkle_root(leaves: Sequence[bytes]) -> bytes:
    """MTH(D[n]) of `leaves` (each a `leaf_bytes`), without keeping the levels. ValueError when empty."""
    level = _leaf_level(leaves)
    while len(level) > 1:
        level = _next_level(level)
    return level[0]


def _is_hash(value: object) -> bool:
    return isinstance(value, bytes | bytearray) and len(value) == HASH_SIZE


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def verify_proof(leaf: bytes, index: int, tree_size: int, path: Sequence[bytes], root: bytes) -> bool:
    """Whether `path` proves `leaf` is leaf `index` of the tree of `tree_size` leaves whose root is `root`.

    RFC 9162 section 2.1.3.2. False, never an exception, for any malformed input:
    an index out of range, a size <= 0, a path of the wrong length, a hash that
    is not 32 bytes, or values of the wrong type.
    """
    if not (_is_count(index) and _is_count(tree_size) and isinstance(leaf, bytes | bytearray) and _is_hash(root)):
        return False
    if tree_size <= 0 or not 0 <= index < tree_size:
        return False
    if isinstance(path, bytes | bytearray | memoryview | str) or not isinstance(path, Sequence):
        return False
    # A tree of n leaves is at most (n - 1).bit_length() levels deep: refuse longer paths before hashing anything.
    if len(path) > (tree_size - 1).bit_length() or not all(_is_hash(p) for p in path):
        return False
    fn, sn = index, tree_size - 1
    r = leaf_hash(bytes(leaf))
    for p in path:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = node_hash(bytes(p), r)
            while fn and not fn & 1:  # fn == sn, a right edge: climb past the levels where it had no sibling
                fn >>= 1
                sn >>= 1
        else:
            r = node_hash(r, bytes(p))
        fn >>= 1
        sn >>= 1
    return sn == 0 and r == bytes(root)
