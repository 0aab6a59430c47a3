"""ULIDs from injected time and randomness, so the simulator can replay a run.

A ULID is 48 bits of milliseconds and 80 random bits in Crockford base32:
sortable by creation time, unique without coordination.
"""

from __future__ import annotations

import random

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_SYSTEM_RNG = random.SystemRandom()


def ulid(now_s: float, rng: random.Random | None = None) -> str:
    ms = int(now_s * 1000) & ((1 << 48) - 1)
    rand = (rng or _SYSTEM_RNG).getrandbits(80)
    n = (ms << 80) | rand
    out = []
    for _ in range(26):
        out.append(_ALPHABET[n & 31])
        n >>= 5
    return "".join(reversed(out))


def short_id(prefix: str, rng: random.Random | None = None, nbytes: int = 6) -> str:
    """A short random id with a readable prefix (e.g. `alloc-3f9a0c1b2d4e`)."""
    return f"{prefix}-{(rng or _SYSTEM_RNG).getrandbits(nbytes * 8):0{nbytes * 2}x}"
