"""Break-glass SSH on the control plane: the user CA, grants and revocations, and each node's access section.

* `ca_init` makes the SSH user CA once (its key 0600 in the server's data dir,
  `bc.pki.ssh`) and puts its public key in every node's access section.
* `grant` signs a short-lived certificate (default 30 min, at most 8 h) for
  `<principal>@<node>` on one user key, and adds that principal to the node's
  access section. Every grant is an event (`ssh.granted`) naming who asked and
  why. A destructive-scope principal (`root`) is not signed at once: the
  request becomes a batch of kind `ssh.grant` whose one leaf is
  `(node, "ssh.grant", sha256(principal, key fingerprint))`, approved with
  `bc approve` like any destructive batch, and the certificate is signed only
  when the requester asks for it after the quorum approved (`fetch`).
* `revoke` marks a serial revoked; every node's access section then lists it
  in `revoked_serials`, which the node's converger turns into its KRL.

The access section is derived, never edited: `sync_access` recomputes it from
the store (the CA key; the node's live principals; the serials revoked before
their certificate expired) and writes it through `bc.control.nodes.specs.write_spec`,
which bumps the generation only on a real change.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from bc.control.base import actor
from bc.control.base.bus import Bus
from bc.control.base.events import publish
from bc.control.nodes.specs import write_spec
from bc.control.quorum import approvers as appr
from bc.control.quorum import batches as quorum
from bc.control.quorum import views as quorum_views
from bc.control.signing.signer import Signer
from bc.errors import Conflict, NotFound, UsageError
from bc.pki import exec_tickets, merkle
from bc.pki import ssh as ssh_pki
from bc.pki.secrets_source import Secrets, ed25519_key
from bc.protocol import ssh_lines
from bc.protocol.pb import common_pb2, spec_pb2
from bc.protocol.pb.session_pb2 import SectionApproval
from bc.protocol.text_safety import unsafe_char
from bc.seams.ids import ulid
from bc.store import Row, Store, Tx
from bc.store import nodes as nodes_sql
from bc.store import quorum as q_sql
from bc.store import ssh as ssh_sql
from bc.store import tunnels as tunnels_sql

DEFAULT_TTL_S = 30 * 60
MAX_TTL_S = 8 * 3600
CLOCK_SKEW_S = 60
"""A certificate is valid from a minute before it is signed, for nodes whose clock runs behind."""
DESTRUCTIVE_PRINCIPALS = frozenset({"root"})
"""Principals whose grant is a batch the quorum approves (docs/quorum.md)."""
GRANT_BATCH_NOT_AFTER_S = 3600.0
MAX_REASON = 500


@dataclass(frozen=True)
class GrantRequest:
    node_id: str
    principal: str
    public_key: str
    ttl_s: int = DEFAULT_TTL_S
    reason: str = ""


def check_request(req: GrantRequest) -> ssh_pki.PublicKey:
    """Every rule a grant's input must meet, before any transaction; UsageError with one sentence."""
    why = ssh_lines.principal_problem(req.principal)
    if why is not None:
        raise UsageError(f"the principal {req.principal!r} {why}")
    if req.ttl_s <= 0:
        raise UsageError(f"the TTL must be positive, not {req.ttl_s} s")
    if req.ttl_s > MAX_TTL_S:
        raise UsageError(f"the TTL {req.ttl_s} s is over the maximum of {MAX_TTL_S} s (8h)")
    if len(req.reason) > MAX_REASON:
        raise UsageError(f"the reason is longer than {MAX_REASON} characters")
    ch = unsafe_char(req.reason)
    if ch is not None:
        raise UsageError(f"the reason holds the control character U+{ord(ch):04X}")
    return ssh_pki.parse_public_key(req.public_key, "the public key")


def key_path(ca_dir: Path) -> Path:
    return ca_dir / ssh_pki.CA_KEY_FILE


# -- the CA --------------------------------------------------------------------------


async def ca_init(store: Store, bus: Bus, signer: Signer, ca_dir: Path, secrets: Secrets, public_key: str = "") -> Row:
    """Make the SSH user CA (once) and put its public key in every node's access section. With `public_key`,
    the CA is offline: its private key stays with the operator, whose CLI signs each grant (`record_cert`)."""
    async with store.transaction(write=False) as tx:
        existing = await ssh_sql.get_ca(tx)
        guarded = await quorum.has_approvers(tx)
    if existing is not None:
        raise Conflict(f"an SSH CA exists already ({existing['fingerprint']}); it is never replaced by init")
    if guarded:  # a new CA key is root-equivalent on every node (bc.protocol.root_equiv): no quorum covers it here
        raise Conflict(
            "approvers are registered, and a node takes a new SSH CA only with their quorum, which `bc ssh ca init`"
            " cannot carry: make the SSH CA before registering approvers"
        )
    if public_key:
        public = ssh_pki.parse_public_key(public_key, "the offline CA's public key")
    else:
        path = key_path(ca_dir)
        if await asyncio.to_thread(path.exists):
            key = await asyncio.to_thread(ssh_pki.load_ca_key, path)  # an init that stopped after writing the key
        else:
            key = ed25519_key(secrets)
            await asyncio.to_thread(ssh_pki.write_ca_key, ca_dir, key)
        public = ssh_pki.parse_public_key(ssh_pki.public_line(key), "the CA key")
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        if not await ssh_sql.insert_ca(tx, public.line, public.fingerprint, bool(public_key), actor.current(), now_ms):
            raise Conflict("an SSH CA exists already; it is never replaced by init")
        data = {"fingerprint": public.fingerprint, "offline": bool(public_key)}
        await publish(tx, bus, "ssh.ca.created", "ssh-ca", data, now_ms)
        await sync_access(tx, bus, signer, now_ms, lock=store.for_update())
        row = await ssh_sql.get_ca(tx)
    assert row is not None
    return row


def is_offline(ca: Row | None) -> bool:
    return ca is not None and bool(int(ca["offline"] or 0))


async def get_ca(store: Store) -> Row | None:
    async with store.transaction(write=False) as tx:
        return await ssh_sql.get_ca(tx)


# -- each node's access section ------------------------------------------------------------


async def sync_access(
    tx: Tx, bus: Bus | None, signer: Signer, now_ms: int, node_ids: Iterable[str] | None = None, *, lock: str = ""
) -> int:
    """Rewrite the access section of `node_ids` (every live node when None) from the store; returns how many
    specs changed. The section's `exec_ticket_jwks` is the live exec-ticket keys' JWKS (`bc.control.trust.tunnels`)
    once there is one; before that it is left as it is."""
    ca = await ssh_sql.get_ca(tx)
    ticket_keys = await tunnels_sql.live_keys(tx)
    ticket_jwks = exec_tickets.jwks_json([json.loads(str(r["public_jwk"])) for r in ticket_keys]) if ticket_keys else ""
    ca_keys = [str(ca["public_key"])] if ca is not None else []
    serials = [str(s) for s in await ssh_sql.revoked_serials(tx)]
    principals: dict[str, list[str]] = {}
    for r in await ssh_sql.live_principals(tx, now_ms):
        principals.setdefault(str(r["node_id"]), []).append(f"{r['principal']}@{r['node_id']}")
    # A root grant's quorum approval goes with the section, so the node can check it (agent/spec_quorum.py).
    approvals: dict[str, list[SectionApproval]] = {}
    single_leaf = common_pb2.BatchProof(leaf_index=0, tree_size=1).SerializeToString(deterministic=True)
    for r in await ssh_sql.live_batched_grants(tx, now_ms):
        approvals.setdefault(str(r["node_id"]), []).append(
            SectionApproval(
                section="access",
                batch_approval=bytes(r["approval"]),
                batch_proof=single_leaf,
                grant_principal=str(r["principal"]),
                grant_fingerprint=str(r["fingerprint"]),
            )
        )
    if node_ids is None:
        node_ids = [str(r["node_id"]) for r in await nodes_sql.list_all(tx)]
    changed = 0
    for node_id in node_ids:

        def mutate(spec: spec_pb2.NodeSpec, node_id: str = node_id) -> None:
            access = spec.access
            del access.ssh_ca_keys[:], access.principals[:], access.revoked_serials[:]
            access.ssh_ca_keys.extend(ca_keys)
            access.principals.extend(sorted(principals.get(node_id, [])))
            access.revoked_serials.extend(serials)
            if ticket_jwks:
                access.exec_ticket_jwks = ticket_jwks
            if access.ByteSize() == 0:
                spec.ClearField("access")

        w = await write_spec(tx, bus, signer, node_id, mutate, now_ms, lock=lock, approvals=approvals.get(node_id, []))
        changed += int(w.changed)
    return changed


# -- grants ----------------------------------------------------------------------------------


async def _new_serial(tx: Tx, rng: random.Random) -> int:
    while True:
        serial = rng.getrandbits(63)
        if serial and not await ssh_sql.serial_taken(tx, serial):
            return serial


async def grant(
    store: Store, bus: Bus, signer: Signer, rng: random.Random, ca_dir: Path, req: GrantRequest, requested_by: str
) -> Row:
    """Issue a certificate now, or (a destructive principal) open its batch; returns the grant's row."""
    user_key = check_request(req)
    destructive = req.principal.lower() in DESTRUCTIVE_PRINCIPALS  # `ROOT` is root to every reader
    ca = await get_ca(store)
    if ca is None:
        raise Conflict("there is no SSH CA yet: run `bc ssh ca init` first")
    offline = is_offline(ca)
    ca_key = None if destructive or offline else await _ca_key(store, ca_dir)
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        if await nodes_sql.get(tx, req.node_id) is None:
            raise NotFound(f"no node named {req.node_id!r}")
        if await ssh_sql.get_ca(tx) is None:
            raise Conflict("there is no SSH CA yet: run `bc ssh ca init` first")
        serial = await _new_serial(tx, rng)
        batch_id = ""
        if destructive:
            batch_id = await _open_batch(tx, bus, req, user_key, serial, requested_by, rng, now_ms)
        await ssh_sql.insert_grant(
            tx,
            serial=serial,
            node_id=req.node_id,
            principal=req.principal,
            public_key=user_key.line,
            fingerprint=user_key.fingerprint,
            ttl_s=req.ttl_s,
            state="pending",
            batch_id=batch_id,
            requested_by=requested_by,
            reason=req.reason,
            now_ms=now_ms,
        )
        row = await ssh_sql.get_grant(tx, serial)
        assert row is not None
        if destructive or offline:
            if not destructive:  # the offline CA signs at once, for the window fixed now
                await ssh_sql.set_window(tx, serial, *_window(row, now_ms))
            data = _grant_event(row) | {"batch_id": batch_id}
            await publish(tx, bus, "ssh.grant.requested", req.node_id, data, now_ms)
        else:
            assert ca_key is not None
            await _issue(tx, bus, signer, ca_key, row, now_ms, store.for_update())
        row = await ssh_sql.get_grant(tx, serial)
    assert row is not None
    return row


async def _open_batch(
    tx: Tx,
    bus: Bus,
    req: GrantRequest,
    user_key: ssh_pki.PublicKey,
    serial: int,
    requested_by: str,
    rng: random.Random,
    now_ms: int,
) -> str:
    """The `ssh.grant` batch of one leaf (node, principal, key fingerprint), pending its quorum."""
    await quorum.check_can_approve(tx, requested_by)
    digest = ssh_pki.grant_digest(req.principal, user_key.fingerprint)
    root = merkle.merkle_root([merkle.leaf_bytes(req.node_id, ssh_pki.GRANT_BATCH_KIND, digest)])
    batch_id = "b-" + ulid(now_ms / 1000, rng)
    payload = {
        "principal": req.principal,
        "fingerprint": user_key.fingerprint,
        "serial": str(serial),
        "ttl_s": req.ttl_s,
    }
    await q_sql.insert_batch(
        tx,
        id_=batch_id,
        kind=ssh_pki.GRANT_BATCH_KIND,
        requested_by=requested_by,
        reason=req.reason,
        payload_json=json.dumps(payload, sort_keys=True, separators=(",", ":")),
        scope_root=root,
        threshold=await appr.threshold(tx),
        now_ms=now_ms,
        not_after_ms=now_ms + round(GRANT_BATCH_NOT_AFTER_S * 1000),
    )
    # No command runs for this leaf: the server signs the certificate once the batch is approved.
    await q_sql.insert_leaf(tx, batch_id, 0, req.node_id, ssh_pki.GRANT_BATCH_KIND, digest, "")
    data = {"kind": ssh_pki.GRANT_BATCH_KIND, "nodes": [req.node_id], "requested_by": requested_by}
    await publish(tx, bus, "batch.created", batch_id, data | {"scope_root": root.hex()}, now_ms)
    return batch_id


async def _ca_key(store: Store, ca_dir: Path) -> Ed25519PrivateKey:
    """The CA's private key, checked against the CA the store names."""
    ca = await get_ca(store)
    if ca is None:
        raise Conflict("there is no SSH CA yet: run `bc ssh ca init` first")
    if is_offline(ca):
        raise UsageError("the SSH CA is offline: sign with its key on your machine (--ca-key FILE)")
    key = await asyncio.to_thread(ssh_pki.load_ca_key, key_path(ca_dir))
    if ssh_pki.public_line(key) != str(ca["public_key"]):
        raise UsageError(
            f"the SSH CA key at {key_path(ca_dir)} is not the CA this cluster trusts ({ca['fingerprint']})"
        )
    return key


def _window(row: Row, now_ms: int) -> tuple[int, int]:
    """A certificate's validity from `now_ms`, in whole seconds (as a certificate carries it), as ms."""
    after_s = (now_ms // 1000) - CLOCK_SKEW_S
    return after_s * 1000, (now_ms // 1000 + int(row["ttl_s"])) * 1000


async def _issue(tx: Tx, bus: Bus, signer: Signer, ca_key: Ed25519PrivateKey, row: Row, now_ms: int, lock: str) -> None:
    """Sign the grant's certificate with the CA key the server holds, then record it."""
    login = f"{row['principal']}@{row['node_id']}"
    valid_after_ms, valid_before_ms = _window(row, now_ms)
    cert = ssh_pki.sign_user_cert(
        ca_key,
        ssh_pki.parse_public_key(str(row["public_key"])),
        serial=int(row["serial"]),
        key_id=f"bc:{row['requested_by'] or '-'}:{login}",
        principals=[login],
        valid_after_s=valid_after_ms // 1000,
        valid_before_s=valid_before_ms // 1000,
    )
    await _record(tx, bus, signer, row, cert, valid_after_ms, valid_before_ms, now_ms, lock)


async def _record(
    tx: Tx,
    bus: Bus,
    signer: Signer,
    row: Row,
    cert: str,
    valid_after_ms: int,
    valid_before_ms: int,
    now_ms: int,
    lock: str,
) -> None:
    """Store the certificate on its grant, publish `ssh.granted`, and add its principal to its node."""
    if not await ssh_sql.issue(tx, int(row["serial"]), cert, valid_after_ms, valid_before_ms):
        raise Conflict(f"grant {row['serial']} was issued, refused or revoked meanwhile")
    data = _grant_event(row) | {"valid_before_ms": valid_before_ms}
    await publish(tx, bus, "ssh.granted", str(row["node_id"]), data, now_ms)
    await sync_access(tx, bus, signer, now_ms, [str(row["node_id"])], lock=lock)


async def record_cert(store: Store, bus: Bus, signer: Signer, serial: int, certificate: str) -> Row:
    """Record a certificate the offline CA signed on the operator's machine, after checking it is exactly the
    grant's: signed by the CA, the grant's serial, its one principal, its user key and its window."""
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        ca = await ssh_sql.get_ca(tx)
        if not is_offline(ca):
            raise UsageError("the SSH CA is not offline: the server signs its certificates itself")
        assert ca is not None
        row = await _find(tx, serial, "", store.for_update())
        if not signable(row):
            raise Conflict(f"grant {serial} is not waiting for a signature (it is {row['state']})")
        facts = ssh_pki.read_user_cert(certificate, str(ca["public_key"]))
        login = f"{row['principal']}@{row['node_id']}"
        want = (serial, [login], int(row["valid_after_ms"]) // 1000, int(row["valid_before_ms"]) // 1000)
        if (facts.serial, facts.principals, facts.valid_after_s, facts.valid_before_s) != want:
            raise UsageError(
                f"the certificate is not grant {serial}'s: it must carry serial {serial}, only {login},"
                f" and the window {want[2]}..{want[3]}"
            )
        if facts.key_line.split()[:2] != str(row["public_key"]).split()[:2]:
            raise UsageError(f"the certificate is for another key than grant {serial}'s ({row['fingerprint']})")
        line = " ".join(certificate.split()[:2]) + f" bc:{row['requested_by'] or '-'}:{login}"
        await _record(
            tx,
            bus,
            signer,
            row,
            line,
            int(row["valid_after_ms"]),
            int(row["valid_before_ms"]),
            now_ms,
            store.for_update(),
        )
        return await _find(tx, serial, "")


def signable(row: Row) -> bool:
    """A grant waiting for the offline CA's signature: pending, unrevoked, its window fixed."""
    return str(row["state"]) == "pending" and row["revoked_at_ms"] is None and int(row["valid_before_ms"] or 0) > 0


def _grant_event(row: Row) -> dict[str, object]:
    return {
        "serial": str(row["serial"]),
        "principal": str(row["principal"]),
        "login": f"{row['principal']}@{row['node_id']}",
        "fingerprint": str(row["fingerprint"]),
        "requested_by": str(row["requested_by"]),
        "reason": str(row["reason"]),
        "ttl_s": int(row["ttl_s"]),
    }


MAX_SERIAL = 2**63 - 1
"""The largest serial bc issues (the store's integers are signed 64-bit)."""


async def find(store: Store, serial: int = 0, batch_id: str = "") -> Row:
    async with store.transaction(write=False) as tx:
        return await _find(tx, serial, batch_id)


async def _find(tx: Tx, serial: int, batch_id: str, lock: str = "") -> Row:
    if batch_id:
        row = await ssh_sql.grant_of_batch(tx, batch_id)
        if row is None:
            raise NotFound(f"batch {batch_id!r} is not an ssh.grant batch of this server")
        return row
    if not 0 < serial <= MAX_SERIAL:  # a uint64 on the wire; the store keeps a signed 64-bit integer
        raise NotFound(f"no SSH certificate with serial {serial}")
    row = await ssh_sql.get_grant(tx, serial, lock)
    if row is None:
        raise NotFound(f"no SSH certificate with serial {serial}")
    return row


async def fetch(store: Store, bus: Bus, signer: Signer, ca_dir: Path, serial: int = 0, batch_id: str = "") -> Row:
    """A grant; a pending one is settled first: signed if its batch was approved, refused if it was
    rejected, withdrawn or expired. Pending and still waiting: returned as it is."""
    row = await find(store, serial, batch_id)
    if str(row["state"]) != "pending" or row["revoked_at_ms"] is not None or not str(row["batch_id"]):
        return row  # settled, or (no batch) waiting for the offline CA's signature
    async with store.transaction(write=False) as tx:
        batch = await q_sql.get_batch(tx, str(row["batch_id"]))
    state = quorum_views.batch_state(batch, await store.now_ms()) if batch is not None else "missing"
    if state == "pending":
        return row
    offline = is_offline(await get_ca(store))
    if state == "approved" and offline and signable(row):
        return row  # approved, and waiting for the operator's signature
    ca_key = await _ca_key(store, ca_dir) if state == "approved" and not offline else None
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        row = await _find(tx, int(row["serial"]), "", store.for_update())
        if str(row["state"]) == "pending" and row["revoked_at_ms"] is None:
            if state == "approved" and offline:
                await ssh_sql.set_window(tx, int(row["serial"]), *_window(row, now_ms))  # signable from now
            elif ca_key is not None:
                await _issue(tx, bus, signer, ca_key, row, now_ms, store.for_update())
            else:
                await ssh_sql.refuse(tx, int(row["serial"]))
                data = _grant_event(row) | {"batch_id": str(row["batch_id"]), "batch_state": state}
                await publish(tx, bus, "ssh.grant.refused", str(row["node_id"]), data, now_ms)
        return await _find(tx, int(row["serial"]), "")


async def batch_state_of(store: Store, row: Row) -> str:
    if not str(row["batch_id"]):
        return ""
    async with store.transaction(write=False) as tx:
        batch = await q_sql.get_batch(tx, str(row["batch_id"]))
    return quorum_views.batch_state(batch, await store.now_ms()) if batch is not None else "missing"


async def grants(store: Store, node_id: str = "", live_only: bool = False) -> list[Row]:
    now_ms = await store.now_ms()
    async with store.transaction(write=False) as tx:
        if node_id and await nodes_sql.get(tx, node_id, include_deleted=True) is None:
            raise NotFound(f"no node named {node_id!r}")
        return await ssh_sql.list_grants(tx, node_id, now_ms if live_only else None)


async def revoke(store: Store, bus: Bus, signer: Signer, serial: int, reason: str, by: str) -> Row:
    """Revoke a certificate by serial: every node's KRL lists it within one converge pass."""
    if len(reason) > MAX_REASON:
        raise UsageError(f"the reason is longer than {MAX_REASON} characters")
    ch = unsafe_char(reason)
    if ch is not None:
        raise UsageError(f"the reason holds the control character U+{ord(ch):04X}")
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        row = await _find(tx, serial, "", store.for_update())
        if not await ssh_sql.revoke(tx, serial, by, reason, now_ms):
            raise Conflict(f"the certificate with serial {serial} is already revoked")
        await ssh_sql.refuse(tx, serial)  # a grant still waiting for its quorum is never signed now
        data = _grant_event(row) | {"revoke_reason": reason}
        await publish(tx, bus, "ssh.revoked", str(row["node_id"]), data, now_ms)
        await sync_access(tx, bus, signer, now_ms, lock=store.for_update())
        row = await _find(tx, serial, "")
    return row
