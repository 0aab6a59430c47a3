"""The NodeSpec writer: canonical JSON in, a new generation only on a real change.

Every generation's encoded `DesiredStateBody` is stored with it (`spec_body`),
so gateways relay exactly the bytes written here and never re-encode; the
signature and its signer's key id are written by the same statement, made by
the `Signer` every caller passes in (`UNSIGNED` from `NullSigner` when
command signing is off). The body also carries the node's operator labels
(`body_labels`): a label change alone is a new generation of the same spec
(`bc nodes label` writes it), so the node reads its labels from a signed body
(a health pre-approval's pool, the kubernetes unit's node labels).

Sizes (`bc.protocol.limits`): a section over `max_section_bytes` is refused
before its transaction, and a spec whose canonical JSON or encoded body would
be over `max_spec_bytes` is refused inside it before anything is written, so a
refused write leaves the generation, the stored spec and what the node is sent
exactly as they were. A write that makes an oversized spec (stored before the
limit) smaller is allowed, so such a spec can be repaired.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from google.protobuf.message import DecodeError, Message

from bc.control.base.bus import Bus
from bc.control.base.events import publish
from bc.control.signing.signer import Signer
from bc.errors import NotFound
from bc.protocol import canonical, limits, spec_validation
from bc.protocol import labels as node_labels
from bc.protocol.pb import spec_pb2
from bc.protocol.pb.session_pb2 import DesiredStateBody, SectionApproval
from bc.store import Store, Tx
from bc.store import nodes as nodes_sql


@dataclass(frozen=True)
class SpecWrite:
    node_id: str
    generation: int
    spec_hash: str
    changed: bool


def encode_body(
    node_id: str,
    generation: int,
    spec: spec_pb2.NodeSpec,
    spec_hash: str,
    approvals: Sequence[SectionApproval] = (),
    labels: Mapping[str, str] | None = None,
) -> bytes:
    body = DesiredStateBody(node_id=node_id, generation=generation, spec_hash=spec_hash, base_generation=0)
    body.full.CopyFrom(spec)
    body.section_approvals.extend(approvals)
    body.labels.update(labels or {})
    return body.SerializeToString(deterministic=True)


def body_labels(labels_json: object) -> dict[str, str]:
    """The labels a node's spec body carries: its operator's (`bc nodes label`), not the system's `bc.dev/cap.*`
    and `bc.dev/driver.*`, which are the node's own word and change with its Hello, not with a spec."""
    doc = json.loads(str(labels_json or "{}"))
    return {str(k): str(v) for k, v in sorted(doc.items()) if not node_labels.is_system(str(k))}


def labels_of_body(body: bytes | None) -> dict[str, str]:
    previous = DesiredStateBody()
    try:
        previous.ParseFromString(body or b"")
    except DecodeError:
        return {}
    return dict(previous.labels)


def carried_approvals(
    old_body: bytes | None, old_spec: spec_pb2.NodeSpec, new_spec: spec_pb2.NodeSpec, fresh: Sequence[SectionApproval]
) -> list[SectionApproval]:
    """The quorum approvals the new body carries: `fresh` ones, and the previous body's for every section whose
    content did not change (so a node that missed the approved generation still gets the approval with a later
    one). docs/quorum.md, "Root-equivalent spec changes"."""
    out = {(a.section, a.grant_principal): a for a in fresh}
    renewed = {a.section for a in fresh}
    previous = DesiredStateBody()
    try:
        previous.ParseFromString(old_body or b"")
    except DecodeError:
        return list(out.values())
    for a in previous.section_approvals:
        same = a.section in canonical.SECTIONS and getattr(old_spec, a.section) == getattr(new_spec, a.section)
        if a.section not in renewed and same:
            out[(a.section, a.grant_principal)] = a
    return [out[k] for k in sorted(out)]


async def load_spec(tx: Tx, node_id: str, lock: str = "") -> tuple[spec_pb2.NodeSpec, int]:
    row = await nodes_sql.spec_for_update(tx, node_id, lock)
    if row is None:
        raise NotFound(f"no node named {node_id!r}")
    return canonical.spec_from_json(str(row["spec"])), int(row["generation"])


async def write_spec(
    tx: Tx,
    bus: Bus | None,
    signer: Signer,
    node_id: str,
    mutate: Callable[[spec_pb2.NodeSpec], None],
    now_ms: int,
    *,
    lock: str = "",
    approvals: Sequence[SectionApproval] = (),
) -> SpecWrite:
    """Apply `mutate` to the stored spec; bump the generation only when the canonical JSON changes.
    `approvals`: the quorum's approvals of the root-equivalent sections it writes (bc.control.quorum.spec_changes)."""
    row = await nodes_sql.spec_for_update(tx, node_id, lock)
    if row is None:
        raise NotFound(f"no node named {node_id!r}")
    spec = canonical.spec_from_json(str(row["spec"]))
    old_spec = spec_pb2.NodeSpec()
    old_spec.CopyFrom(spec)
    before = spec_size(str(row["spec"]), encode_body(node_id, int(row["generation"]), spec, str(row["spec_hash"])))
    mutate(spec)
    text = canonical.spec_to_canonical(spec)
    generation = int(row["generation"])
    old_body = row.get("spec_body")
    labels = body_labels(row.get("labels"))
    # A label change is a new generation of the same spec: the node's labels travel in its signed body.
    same_labels = labels == labels_of_body(bytes(old_body) if old_body is not None else None)
    if text == str(row["spec"]) and generation > 0 and same_labels:
        return SpecWrite(node_id, generation, str(row["spec_hash"]), changed=False)
    generation += 1
    h = canonical.spec_hash(text)
    kept = carried_approvals(bytes(old_body) if old_body is not None else None, old_spec, spec, approvals)
    body = encode_body(node_id, generation, spec, h, kept, labels)
    after = spec_size(text, body)
    if after > before:  # a write that shrinks a spec stored before the limit is let through
        limits.check_size(f"the spec of {node_id} would be", after, "max_spec_bytes")
    signed = signer.sign_spec(body)
    await nodes_sql.write_spec(
        tx, node_id, generation, text, h, body, signed.stored, signed.key_id, sign_pending=signed.pending
    )
    await publish(tx, bus, "node.spec", node_id, {"generation": generation, "spec_hash": h}, now_ms)
    if bus is not None:
        tx.on_commit(lambda: bus.node_changed(node_id))
    return SpecWrite(node_id, generation, h, changed=True)


def spec_size(canonical_text: str, body: bytes) -> int:
    """What `max_spec_bytes` bounds: the larger of the canonical JSON (GetSpec's reply) and the encoded body
    (the DesiredState frame)."""
    return max(limits.text_size(canonical_text), len(body))


def check_section_size(section: str, section_json: str, msg: Message | None = None) -> None:
    """`max_section_bytes` over the JSON text, and once parsed, over the encoded section."""
    what = f"the {section} section"
    limits.check_size(what, limits.text_size(section_json), "max_section_bytes")
    if msg is not None:
        limits.check_size(what, msg.ByteSize(), "max_section_bytes")


def section_mutation(section: str, section_json: str) -> Callable[[spec_pb2.NodeSpec], None]:
    """Check one section's input (name, size, parse, content) and return the write that replaces it
    wholesale (`{}` clears it). The devices section belongs to reservations."""
    from bc.errors import UsageError

    if section in canonical.SECTIONS:
        check_section_size(section, section_json)  # before parsing what may be megabytes
    msg = canonical.section_from_json(section, section_json)
    if section == "devices":
        raise UsageError("the devices section is managed by reservations; use `bc reserve` and `bc release`")
    check_section_size(section, section_json, msg)
    spec_validation.check_section(section, msg)

    def mutate(spec: spec_pb2.NodeSpec) -> None:
        getattr(spec, section).CopyFrom(msg)
        if msg.ByteSize() == 0:
            spec.ClearField(section)  # type: ignore[arg-type,unused-ignore]

    return mutate


async def set_section(
    store: Store, bus: Bus, signer: Signer, node_id: str, section: str, section_json: str
) -> SpecWrite:
    """Replace one section wholesale. Everything about the input is checked before the transaction;
    the whole spec's size is checked in it, before anything is written."""
    mutate = section_mutation(section, section_json)
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        return await write_spec(tx, bus, signer, node_id, mutate, now_ms, lock=store.for_update())
