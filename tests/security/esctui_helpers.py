"""Helpers of the esctui security tests: hostile protobuf replies for the TUI's fake source, and what the
terminal would be sent, read from the screens' rendered strips (the segments Textual's driver writes)."""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Iterator

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from textual.app import App

from bc.pki import merkle
from bc.pki.batch_scope import leaf_digest
from bc.protocol.pb import admin_pb2
from bc.protocol.text_safety import is_unsafe
from tests.strategies import HOSTILE_TEXT
from tui.fake import FakeSource

# Markup a node could send, as typed: none of it may style, link or stop the screen.
MARKUP = ["[red]x[/]", "[link=https://evil.example]click[/link]", "[b]", "[/]", "[@click=app.quit]q[/]"]
# The corpus: every short hostile text (a table cell 70,000 wide tests the table, not the escaping), the markup,
# and the characters a terminal acts on that the corpus lacks (a C1 CSI, an isolate, a line separator, a tab).
PROBES = [t for t in HOSTILE_TEXT if len(t) <= 100] + MARKUP + ["\x9b31m", "\u2066iso\u2069", "l\u2028s", "t\tb"]
# What the approval dialog must show as typed (escaped, markup as text).
SEEN_AS_TYPED = ["a\\u202eb", "\\x1b]0;owned\\x07", "[red]x[/]", "[link=https://evil.example]l"]

# The fake source filters on these (a batch is listed while `pending`, a reservation by its state).
# A batch keeps a real kind (its payload is parsed to recompute what is signed); its payload's text is hostile.
KEEP = {("BatchInfo", "state"), ("BatchInfo", "kind"), ("BatchLeafInfo", "kind"), ("Reservation", "state")}
BATCH_PAYLOAD = json.dumps(
    {"gpuUuids": ["GPU-a\u202eb[red]x[/]\x1b]0;owned\x07", "[link=https://evil.example]l"]}, ensure_ascii=False
)


def texts() -> Iterator[str]:
    """Hostile strings, each a probe with a number after it (ids must stay distinct)."""
    for n in itertools.count():
        yield f"{PROBES[n % len(PROBES)]}{n}"


def fill(msg: Message, values: Iterator[str], depth: int = 0) -> None:
    """Every string field of `msg` (nested, repeated, maps) set to a hostile value; an empty list gets one."""
    for fd in msg.DESCRIPTOR.fields:
        if (msg.DESCRIPTOR.name, fd.name) in KEEP:
            continue
        repeated = fd.is_repeated
        if fd.type == FieldDescriptor.TYPE_STRING:
            if repeated:
                field = getattr(msg, fd.name)
                n = max(1, len(field))
                del field[:]
                field.extend(next(values) for _ in range(n))
            else:
                setattr(msg, fd.name, next(values))
        elif fd.type == FieldDescriptor.TYPE_MESSAGE and depth < 4:
            field = getattr(msg, fd.name)
            if fd.message_type.GetOptions().map_entry:
                value_fd = fd.message_type.fields_by_name["value"]
                if value_fd.type == FieldDescriptor.TYPE_STRING:
                    field.clear()
                    for _ in range(2):
                        field[next(values)] = next(values)
            elif repeated:
                if not len(field):
                    field.add()
                for item in field:
                    fill(item, values, depth + 1)
            else:
                fill(field, values, depth + 1)


class HostileSource(FakeSource):
    """The seeded fake with every string it serves hostile (ids, names, states, reasons, labels, JSON)."""

    def __init__(self) -> None:
        super().__init__(random.Random(7), nodes=4)
        values = texts()
        for group in (
            list(self.nodes.values()),
            self.commands,
            self.batches,
            self.quorum_changes,
            self.jobs,
            self.reservations,
            self.events,
            self.machines,
        ):
            for m in group:
                fill(m, values)
        if not self.quorum_changes:
            change = admin_pb2.QuorumChangeInfo(state="pending")
            fill(change, values)
            change.state = "pending"
            self.quorum_changes.append(change)
        self.nodes = {n.node_id: n for n in self.nodes.values()}
        for i, m in enumerate(self.machines):  # a machine's state is in the machines screen's summary, whole
            m.state = f"{MARKUP[i % len(MARKUP)]}{m.state}"
        for b in self.batches:  # signable, so the approval dialog opens: the leaves agree with the batch
            b.payload_json = BATCH_PAYLOAD
            # JSON escapes its own control characters (\u001b): a raw OSC reaches the dialog in the reason, put
            # there on purpose (which probe lands in which field moves whenever a message gains a field).
            b.reason = "\x1b]0;owned\x07 " + b.reason
            digest = leaf_digest(b)
            for leaf in b.leaves:
                leaf.kind, leaf.payload_digest = b.kind, digest.hex()
                # A leaf's encoding cannot hold a newline (bc.pki.merkle refuses it; no node id has one): the rest
                # of the probe stays hostile.
                leaf.node_id = leaf.node_id.replace("\n", "\u2028")
            b.scope_root = merkle.merkle_root(
                [merkle.leaf_bytes(leaf.node_id, leaf.kind, digest) for leaf in b.leaves]
            ).hex()
        self._values = values
        self.usage_rows: list[admin_pb2.UsageRow] = []
        for key in [*self.nodes, *(r.id for r in self.reservations)]:
            row = admin_pb2.UsageRow(key=key, atom_ms=3_600_000, device_class="gpu.mig")
            row.profile = next(values)
            self.usage_rows.append(row)

    async def usage(self, *, since_ms: int = 0, until_ms: int = 0, by: str = "") -> admin_pb2.UsageResponse:
        return admin_pb2.UsageResponse(rows=self.usage_rows)

    async def get_pki(self) -> admin_pb2.PkiInfo:
        pki = admin_pb2.PkiInfo(command_signing=True)
        fill(pki, self._values)
        return pki

    async def list_jobs(self, *, include_all: bool = False) -> admin_pb2.ListJobsResponse:
        resp = await super().list_jobs(include_all=include_all)
        for p in resp.pools:
            p.name = next(self._values)
        return resp


def drawn(app: App[None]) -> list[list[tuple[str, str | None]]]:
    """What every screen on the stack draws now: per line, its segments' text and hyperlink (None: no link)."""
    out = []
    for screen in app.screen_stack:
        update = screen._compositor.render_update(full=True)
        for line in getattr(update, "strips", []):
            out.append([(seg.text, seg.style.link if seg.style else None) for strip in line for seg in strip])
    return out


def unsafe_drawn(app: App[None]) -> list[str]:
    """The lines drawn with a control, C1 or bidi character in them, as repr (empty when none)."""
    lines = ["".join(t for t, _ in line) for line in drawn(app)]
    return [repr(line.strip()) for line in lines if any(is_unsafe(c) for c in line)]


def links_drawn(app: App[None]) -> list[str]:
    return [f"{text!r} -> {link}" for line in drawn(app) for text, link in line if link]


def screen_text(app: App[None]) -> str:
    return "\n".join("".join(t for t, _ in line) for line in drawn(app))
