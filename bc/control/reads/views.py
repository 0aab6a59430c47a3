"""Store rows to the Admin API's messages: what an operator sees of a node, a spec, a reservation, a command."""

from __future__ import annotations

import base64
import functools
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from cryptography import x509
from cryptography.x509.oid import NameOID
from google.protobuf import json_format

from bc.control.capacity import no_schedule, node_capacity
from bc.pki import keys
from bc.protocol.pb import admin_pb2, common_pb2
from bc.store import Row
from bc.store import nodes as nodes_sql
from bc.store import revocation as rev_sql

if TYPE_CHECKING:  # the type of a message's repeated field, for the hints only
    from google.protobuf.internal.containers import RepeatedCompositeFieldContainer


def signing_key_info(cert: x509.Certificate) -> admin_pb2.SigningKeyInfo:
    cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return admin_pb2.SigningKeyInfo(
        key_id=keys.fingerprint(cert),
        subject=str(cn[0].value) if cn else "",
        not_before_ms=int(cert.not_valid_before_utc.timestamp() * 1000),
        not_after_ms=int(cert.not_valid_after_utc.timestamp() * 1000),
        cert_pem=keys.cert_to_pem(cert).decode(),
    )


UNHEALTHY_GPUS = no_schedule.UnhealthyGpusMemo()
"""The listing parses each node's inventory once, not at every `bc nodes` (`UnhealthyGpusMemo`)."""


@functools.lru_cache(maxsize=4096)
def _small_json(text: str) -> Any:
    """A node's labels or capabilities, parsed once per distinct text (a fleet has few: racks, zones, one
    agent version's capabilities). Read only: the message copies them."""
    return json.loads(text)


def node_info(
    row: Row,
    now_ms: int,
    *,
    detail: bool,
    certs: Row | None = None,
    gpu_cordons: Sequence[Row] = (),
) -> admin_pb2.NodeInfo:
    """The node as `bc nodes show` and a write's reply show it (`nodes.get`'s row); `gpu_cordons`: its rows of
    `bc.store.health.gpu_cordons`. The fleet listing makes the same message apart (`add_listed_node`)."""
    last_seen = row["last_seen_ms"]
    since = row["connectivity_since_ms"]
    info = admin_pb2.NodeInfo(
        node_id=str(row["node_id"]),
        role=str(row["role"]),
        state=str(row["connectivity"]),
        generation=int(row["generation"]),
        applied_generation=int(row["applied_generation"]),
        observed_generation=int(row["observed_generation"]),
        last_seen_age_ms=-1 if last_seen is None else max(0, now_ms - int(last_seen)),
        session_epoch=int(row["session_epoch"] or 0),
        gateway_id=str(row["gateway_id"] or ""),
        boot_id=str(row["boot_id"] or ""),
        journal_id=str(row["journal_id"] or ""),
        spec_hash=str(row["spec_hash"]),
        applied_spec_hash=str(row["applied_spec_hash"]),
        capabilities=_small_json(str(row["capabilities"] or "[]")),
        labels=_small_json(str(row["labels"] or "{}")),
        cordoned=bool(row["cordoned"]),
        state_age_ms=-1 if since is None else max(0, now_ms - int(since)),
    )
    if certs is not None:
        info.cert_not_after_ms = int(certs["not_after_ms"] or 0)
        info.revoked = int(certs["total"] or 0) > 0 and int(certs["live"] or 0) == 0
        info.revoke_reason = str(certs["revoke_reason"] or "") if info.revoked else ""
    info.job_hold = str(row["job_hold"] or "")
    info.no_schedule.extend(
        no_schedule.reasons(
            connectivity=info.state,
            cordoned=info.cordoned,
            job_hold=info.job_hold,
            revoked=info.revoked,
            unhealthy_gpus=UNHEALTHY_GPUS(
                info.node_id, str(row["inventory"] or "{}"), str(row.get("inventory_hash") or "")
            ),
            cordoned_gpus=[(str(c["gpu_uuid"]), bool(c["quarantined"])) for c in gpu_cordons],
        )
    )
    if detail:
        if info.state == "unreachable":
            # The control plane's own condition: the node cannot report it, being away.
            info.conditions.add(
                type="NodeUnreachable",
                status="True",
                reason="NoSession",
                message="no session for longer than the lease and the grace; nothing it holds is released",
                age_ms=max(0, info.state_age_ms),
            )
        status = json.loads(str(row["status"] or "{}"))
        for s in status.get("sections", []):
            json_format.ParseDict(s, info.sections.add(), ignore_unknown_fields=True)
        for i in status.get("instances", []):
            inst = info.instances.add()
            json_format.ParseDict(i, inst, ignore_unknown_fields=True)
            inst.node_id = info.node_id
        if "volume_storage" in status:
            json_format.ParseDict(status["volume_storage"], info.volume_storage, ignore_unknown_fields=True)
        for c in status.get("conditions", []):
            cond = info.conditions.add()
            json_format.ParseDict(
                {k: v for k, v in c.items() if k not in ("since_ms", "age_ms")}, cond, ignore_unknown_fields=True
            )
            cond.age_ms = max(0, now_ms - int(c.get("since_ms", now_ms)))
        inv = common_pb2.Inventory()
        json_format.Parse(str(row["inventory"] or "{}"), inv, ignore_unknown_fields=True)
        info.inventory.CopyFrom(inv)
    return info


@functools.lru_cache(maxsize=16_384)
def _listed_tags(capabilities: str, labels: str) -> bytes:
    """A node's capabilities and labels as the serialized `NodeInfo` fields that carry them, made once per
    distinct pair of texts (a fleet has few: one agent version's capabilities, a rack's and a zone's labels)
    and merged into each message in one call: a map field set from a dict goes through Python's
    `MutableMapping.update`, about 2 µs a node (1 µs merged). A fleet whose every node has a label of its own
    keeps an entry a node (2.5 MB for 10,000); past 16,384 of them each listing misses, 9 µs a node against
    the 6 µs parsing and setting them took."""
    return admin_pb2.NodeInfo(capabilities=json.loads(capabilities), labels=json.loads(labels)).SerializeToString()


def add_listed_node(
    nodes: RepeatedCompositeFieldContainer[admin_pb2.NodeInfo],
    row: nodes_sql.ListedRow,
    now_ms: int,
    *,
    certs: rev_sql.CertState | None,
    gpu_cordons: Sequence[Row],
    unhealthy_gpus: Sequence[str],
) -> admin_pb2.NodeInfo:
    """Append to `nodes` (a page's `ListNodesResponse.nodes`) what `node_info(row, detail=False)` makes of a row
    of the fleet listing (`bc.store.nodes.list_page`), with less Python per node: the row's values by
    position, the message made in its page's message (a `NodeInfo` made apart is copied into it), the
    capabilities and labels merged from `_listed_tags`, and the NoSchedule reasons only for a node that has
    one. `certs`: the node's `cert_states` of its identity generation. tests/unit/control/test_listed_nodes.py
    compares the two."""
    (
        node_id,
        role,
        state,
        since,
        generation,
        applied_generation,
        observed_generation,
        last_seen,
        spec_hash,
        applied_spec_hash,
        capabilities,
        labels,
        cordoned,
        job_hold,
        _inventory_hash,
        gateway_id,
        session_epoch,
        journal_id,
        boot_id,
        _identity_generation,
    ) = row
    info = nodes.add(
        node_id=node_id,
        role=role,
        state=state,
        generation=generation,
        applied_generation=applied_generation,
        observed_generation=observed_generation,
        last_seen_age_ms=-1 if last_seen is None else max(0, now_ms - last_seen),
        session_epoch=session_epoch or 0,
        gateway_id=gateway_id or "",
        boot_id=boot_id or "",
        journal_id=journal_id or "",
        spec_hash=spec_hash,
        applied_spec_hash=applied_spec_hash,
        cordoned=bool(cordoned),
        state_age_ms=-1 if since is None else max(0, now_ms - since),
        job_hold=job_hold or "",
    )
    info.MergeFromString(_listed_tags(capabilities or "[]", labels or "{}"))
    revoked = False
    if certs is not None:
        not_after_ms, live, revoke_reason, total = certs
        info.cert_not_after_ms = not_after_ms or 0
        revoked = info.revoked = total > 0 and live == 0
        info.revoke_reason = (revoke_reason or "") if revoked else ""
    if revoked or cordoned or job_hold or state != "connected" or unhealthy_gpus or gpu_cordons:
        info.no_schedule.extend(
            no_schedule.reasons(
                connectivity=state,
                cordoned=bool(cordoned),
                job_hold=job_hold or "",
                revoked=revoked,
                unhealthy_gpus=unhealthy_gpus,
                cordoned_gpus=[(str(c["gpu_uuid"]), bool(c["quarantined"])) for c in gpu_cordons],
            )
        )
    return info


def add_capacity(info: admin_pb2.NodeInfo, bookings: list[Row], now_ms: int) -> None:
    """`bc nodes show`'s capacity: per class offered / booked now / free now / booked later, and host resources."""
    classes, host = node_capacity.node_capacity(info.inventory, bookings, now_ms)
    for c in classes:
        info.capacity.add(
            device_class=c.device_class,
            offered=c.offered,
            booked_now=c.booked_now,
            free_now=c.free_now,
            booked_later=c.booked_later,
        )
    info.host_capacity.CopyFrom(
        admin_pb2.HostCapacity(
            cpus=host.cpus,
            memory_bytes=host.memory_bytes,
            hugepages_1g=host.hugepages_1g,
            cpus_booked=host.cpus_booked,
            memory_booked=host.memory_booked,
            hugepages_1g_booked=host.hugepages_1g_booked,
        )
    )


def reservation(row: Row, bookings: list[Row], now_ms: int) -> admin_pb2.Reservation:
    """The reservation as the API shows it; the interval is the booked one (the asked one while unbooked)."""
    booked = [b for b in bookings if b.get("start_ms") is not None]
    interval = (booked[0]["start_ms"], booked[0].get("end_ms")) if booked else (row.get("start_ms"), row.get("end_ms"))
    return admin_pb2.Reservation(
        id=str(row["id"]),
        node_id=str(row["node_id"] or ""),  # empty while pending, unbooked
        allocation_id=str(row["allocation_id"]),
        device_class=str(row["device_class"]),
        gpus=int(row["gpus"]),
        state=str(row["state"]),
        reason=str(row["reason"] or ""),
        devices=[
            admin_pb2.BookedDevice(
                device_class=str(b["device_class"]), atom_id=str(b["atom_id"]), gpu_uuid=str(b["gpu_uuid"])
            )
            for b in bookings
        ],
        generation=int(row["generation"]),
        created_age_ms=max(0, now_ms - int(row["created_at_ms"])),
        binding=str(row["binding"]),
        start_ms=int(interval[0] or 0),
        end_ms=int(interval[1] or 0),
        duration_ms=int(row.get("duration_ms") or 0),
        tenant=str(row.get("tenant") or ""),
        selector={str(k): str(v) for k, v in json.loads(str(row.get("selector") or "{}")).items()},
        want_node_id=str(row.get("want_node_id") or ""),
        cpus=int(row.get("cpus") or 0),
        memory_bytes=int(row.get("memory_bytes") or 0),
        hugepages_1g=int(row.get("hugepages_1g") or 0),
        seq=int(row.get("seq") or 0),
    )


def event_record(row: Row) -> admin_pb2.EventRecord:
    return admin_pb2.EventRecord(
        seq=int(row["seq"]),
        type=str(row["type"]),
        subject=str(row["subject"]),
        data_json=str(row["data"]),
        at_ms=int(row["at_ms"]),
    )


def result_text(result: bytes | None) -> str:
    """A stored result for people and scripts: its text when it is JSON (the agent's canonical JSON), else base64.

    The bytes themselves stay untouched in the store; this is only how they are shown.
    """
    if not result:
        return ""
    raw = bytes(result)
    try:
        text = raw.decode("utf-8")
        json.loads(text)
    except (UnicodeDecodeError, ValueError, RecursionError):  # nested past the parser's depth: shown as bytes
        return base64.b64encode(raw).decode("ascii")
    return text


def command_info(row: Row, now_ms: int) -> admin_pb2.CommandInfo:
    return admin_pb2.CommandInfo(
        id=str(row["id"]),
        node_id=str(row["node_id"]),
        kind=str(row["kind"]),
        state=str(row["state"]),
        reason=str(row["reason"] or ""),
        message=str(row["message"] or ""),
        result_json=result_text(row["result"]),
        seq=int(row["seq"]),
        lane=str(row["lane"]),
        attempt=int(row["attempt"]),
        idempotency_key=str(row["idempotency_key"]),
        not_after_ms=int(row["not_after_ms"]),
        min_generation=int(row["min_generation"]),
        created_age_ms=max(0, now_ms - int(row["created_at_ms"])),
        updated_age_ms=max(0, now_ms - int(row["updated_at_ms"])),
        boot_id=str(row["boot_id"] or ""),
        batch_id=str(row["batch_id"] or ""),
        cancel_requested=row["cancel_requested_at_ms"] is not None,
        requested_by=str(row.get("requested_by") or ""),
        signer_key_id=str(row.get("signer_key_id") or ""),
        attested=bool(row.get("attested") or 0),
    )


def fit_command_results(infos: list[admin_pb2.CommandInfo], budget: int) -> list[admin_pb2.CommandInfo]:
    """A list reply under `budget` encoded bytes: results are kept in order while they fit, then left out.

    A result may be up to `max_result_bytes`, so a hundred of them would outgrow any frame and make the
    list itself fail; every command's own fields always fit, and `bc cmd show ID` carries its result.
    """
    spent = sum(i.ByteSize() + 8 for i in infos) - sum(len(i.result_json.encode()) for i in infos)
    for info in infos:
        size = len(info.result_json.encode())
        if spent + size > budget:
            info.result_json = ""
            info.result_omitted = True
        else:
            spent += size
    return infos


def events_within(records: list[admin_pb2.EventRecord], budget: int) -> list[admin_pb2.EventRecord]:
    """The first records whose encoded sizes add up to at most `budget` (at least one): the caller pages on."""
    out: list[admin_pb2.EventRecord] = []
    spent = 0
    for r in records:
        spent += r.ByteSize() + 8
        if out and spent > budget:
            break
        out.append(r)
    return out
