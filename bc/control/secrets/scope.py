"""Which nodes may read a secret: its scope, a list of node ids and node-label selectors.

A node may read a secret when its id is in the scope's `nodes`, or its labels carry any of the scope's
`labels` selectors (`KEY=VALUE`, exact; `KEY` alone: the label is set, whatever its value). An empty
scope admits no node: a secret is readable only where an admin said so. The scope is checked on every
request, against the node's labels at that moment, so relabelling a node out of a scope stops the next
delivery (what it holds already, it keeps until its section changes).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bc.errors import UsageError
from bc.protocol import labels as label_rules

NODE_ID = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
"""A node id as joins issue them (bc.control.trust.identity.NODE_ID)."""


@dataclass(frozen=True)
class Scope:
    nodes: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.nodes and not self.labels


def parse(nodes: Sequence[str], labels: Sequence[str]) -> Scope:
    """A scope from the operator's flags, checked (UsageError with the bad selector)."""
    for sel in labels:
        key, eq, value = sel.partition("=")
        label_rules.check_key(key)
        if eq:
            label_rules.check_value(key, value)
    for n in nodes:
        if not NODE_ID.fullmatch(n):
            raise UsageError(f"bad node id {n!r} in the secret's scope: 1-63 of a-z 0-9 . _ -, starting alphanumeric")
    return Scope(tuple(sorted(set(nodes))), tuple(sorted(set(labels))))


def admits(scope: Scope, node_id: str, node_labels: Mapping[str, str]) -> bool:
    if node_id in scope.nodes:
        return True
    for sel in scope.labels:
        key, eq, value = sel.partition("=")
        if key in node_labels and (not eq or node_labels[key] == value):
            return True
    return False
