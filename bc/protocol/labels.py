"""Node labels: what a key and a value may be, which keys belong to the system, and one edit.

Keys and values follow Kubernetes' rules, so a label an operator already uses
there means the same here: a key is an optional DNS-subdomain prefix and a
`/`, then a name of at most 63 characters (alphanumerics, `-`, `_`, `.`,
starting and ending alphanumeric); a value is empty or such a name. Keys under
`bc.dev/cap.` and `bc.dev/driver.` are written by the gateway from what a node
advertises (capacity places on them), so an operator can neither set nor
remove them: a label that says a node enforces limits must be the node's word.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from bc.errors import UsageError

SYSTEM_PREFIXES: tuple[str, ...] = ("bc.dev/cap.", "bc.dev/driver.")
MAX_LABELS = 64

_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")
_DNS_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")


def check_key(key: str) -> None:
    prefix, slash, name = key.rpartition("/")
    if not slash:
        prefix, name = "", key
    if not _NAME.fullmatch(name):
        raise UsageError(
            f"bad label key {key!r}: its name must be 1-63 letters, digits, '-', '_' or '.', starting and ending"
            " with a letter or digit"
        )
    if slash and (len(prefix) > 253 or not all(_DNS_LABEL.fullmatch(p) for p in prefix.split("."))):
        raise UsageError(f"bad label key {key!r}: its prefix must be a DNS subdomain (lower case, dots)")


def check_value(key: str, value: str) -> None:
    if value and not _NAME.fullmatch(value):
        raise UsageError(
            f"bad value {value!r} for label {key}: at most 63 letters, digits, '-', '_' or '.', starting and ending"
            " with a letter or digit (or empty)"
        )


def is_system(key: str) -> bool:
    return key.startswith(SYSTEM_PREFIXES)


def edit(current: Mapping[str, str], set_: Mapping[str, str], remove: Sequence[str]) -> dict[str, str]:
    """`current` with `set_` applied and `remove` removed, or one UsageError naming the first problem."""
    if not set_ and not remove:
        raise UsageError("nothing to change: give key=value pairs to set or --remove KEY")
    both = set(set_) & set(remove)
    if both:
        raise UsageError(f"label {sorted(both)[0]} is both set and removed")
    for key, value in set_.items():
        check_key(key)
        check_value(key, value)
    for key in [*set_, *remove]:
        if is_system(key):
            raise UsageError(f"label {key} is the system's: the node's gateway writes it from what the node advertises")
    for key in remove:
        check_key(key)
    out = {k: v for k, v in current.items() if k not in remove}
    out.update(set_)
    if len(out) > MAX_LABELS:
        raise UsageError(f"a node has at most {MAX_LABELS} labels")
    return dict(sorted(out.items()))


def parse_pairs(pairs: Sequence[str]) -> dict[str, str]:
    """`key=value` arguments (a value may be empty: `key=`), each key once."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq:
            raise UsageError(f"{pair!r} is not key=value (to remove a label: --remove {pair})")
        if key in out:
            raise UsageError(f"label {key} is given twice")
        out[key] = value
    return out
