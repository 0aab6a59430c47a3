"""ULIDs and short ids from injected time and randomness, so the simulator can replay a run.

A ULID is 48 bits of milliseconds and 80 random bits in Crockford base32:
sortable by creation time, unique without coordination. The Random is the
process's one seeded Random (`bc.pki.secrets_source.os_seeded_random` in
production, the simulator's seed otherwise); there is no fallback, so a
caller that forgot it is a type error, not a silently unreplayable id.
"""

from __future__ import annotations

import random

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def ulid(now_s: float, rng: random.Random) -> str:
    ms = int(now_s * 1000) & ((1 << 48) - 1)
    n = (ms << 80) | rng.getrandbits(80)
    out = []
    for _ in range(26):
        out.append(_ALPHABET[n & 31])
        n >>= 5
    return "".join(reversed(out))


def short_id(prefix: str, rng: random.Random, nbytes: int = 6) -> str:
    """A short random id with a readable prefix (e.g. `alloc-3f9a0c1b2d4e`)."""
    return f"{prefix}-{rng.getrandbits(nbytes * 8):0{nbytes * 2}x}"
