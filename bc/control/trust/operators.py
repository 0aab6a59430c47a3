"""Named operators with roles: who may call what on the Admin API, and the certificates that say who they are.

An operator is a name, a role and the certificates the CA issued to that name
(`bc operators add`). Roles nest, each allowing what the one before it does:

* viewer   — List, Get and Watch (the TUI on a shared screen);
* operator — also reservations, commands, specs, jobs, creating batches, approving and rejecting;
* admin    — also tokens, node revoke/delete/cordon, approvers, operators and the PKI.

A call is taken only under a certificate whose serial was registered for that
operator when it was issued, and only while the operator is not revoked: the
CA signature alone is not enough, so a revoked operator's certificate (which
stays valid for TLS until it expires) is refused at once by every gateway.
The operator `bc serve` made at its first start, `local`, is an admin.
"""

from __future__ import annotations

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from bc.control.base.actor import RANK, ROLES, Caller
from bc.control.base.bus import Bus
from bc.control.base.events import publish
from bc.control.quorum import approvers
from bc.control.quorum import liveness as liveness
from bc.errors import Conflict, NotFound, Unauthenticated, UsageError
from bc.pki import keys
from bc.pki.ca import CertificateAuthority
from bc.pki.identity import PeerIdentity, check_safe_name
from bc.protocol.pb import admin_pb2
from bc.store import Row, Store, Tx
from bc.store import operators as ops_sql

DEFAULT_ROLE = "operator"
LOCAL = "local"
MAX_REASON = 500


def check_role(role: str) -> str:
    if role not in RANK:
        raise UsageError(f"the role {role[:40]!a} is not one of {', '.join(ROLES)}")
    return role


async def authorize(store: Store, peer: PeerIdentity, need: str, what: str) -> Caller:
    """The caller behind `peer` if it may make a call that needs role `need`; else Unauthenticated, in a sentence."""
    async with store.transaction(write=False) as tx:
        row = await ops_sql.get(tx, peer.name)
        cert = await ops_sql.cert(tx, peer.serial)
    if row is None:
        raise Unauthenticated(f"operator {peer.name!r} is not known to this server; ask an admin for a config")
    name = str(row["name"])
    if row["revoked_at_ms"] is not None:
        reason = str(row["revoke_reason"] or "no reason given")
        raise Unauthenticated(f"operator {name} was revoked ({reason}); ask an admin for a new config")
    if cert is None or str(cert["name"]) != name:
        raise Unauthenticated(
            f"this certificate (serial {peer.serial}) was not issued to operator {name} by this server;"
            " ask an admin for a new config"
        )
    role = str(row["role"])
    if RANK[role] < RANK[need]:
        raise Unauthenticated(f"{what} needs the {need} role; operator {name} has the {role} role")
    return Caller(name, role)


def _public_key(pem: bytes) -> ec.EllipticCurvePublicKey:
    try:
        pub = serialization.load_pem_public_key(pem)
    except (ValueError, TypeError):
        raise UsageError("the operator's public key is not a PEM public key") from None
    if not isinstance(pub, ec.EllipticCurvePublicKey) or not keys.is_p256(pub):
        raise UsageError("the operator's key must be an ECDSA P-256 key")
    return pub


async def add(
    store: Store,
    bus: Bus | None,
    ca: CertificateAuthority,
    name: str,
    role: str,
    public_key_pem: bytes,
    created_by: str,
) -> tuple[Row, bytes]:
    """A new operator and its first certificate (for `public_key_pem`); returns its row and the certificate PEM."""
    check_safe_name("operator name", name)
    check_role(role)
    cert = ca.issue_operator_cert(name, _public_key(public_key_pem))
    serial = format(cert.serial_number, "x")
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        existing = await ops_sql.get(tx, name)
        if existing is not None:
            if existing["revoked_at_ms"] is not None:
                raise Conflict(f"operator {name} was revoked; a name is never reused (its history names it)")
            raise Conflict(f"operator {name} already exists (a {existing['role']})")
        await ops_sql.insert(tx, name, role, created_by, now_ms)
        await ops_sql.add_cert(tx, serial, name, int(cert.not_valid_after_utc.timestamp() * 1000), now_ms)
        await publish(tx, bus, "operator.added", name, {"role": role, "serial": serial}, now_ms)
        row = await ops_sql.get(tx, name)
    assert row is not None
    return row, keys.cert_to_pem(cert)


def _check_reason(reason: str) -> None:
    if len(reason) > MAX_REASON:
        raise UsageError(f"the reason is longer than {MAX_REASON} characters")


async def _unrevoked(tx: Tx, name: str, if_revoked: str) -> Row:
    """The operator's row, for a change that needs them present and not revoked (`if_revoked`: the refusal)."""
    row = await ops_sql.get(tx, name)
    if row is None:
        raise NotFound(f"no operator named {name!r}")
    if row["revoked_at_ms"] is not None:
        raise Conflict(if_revoked)
    return row


async def revoke(store: Store, bus: Bus | None, name: str, reason: str, by: str) -> Row:
    """Refuse every certificate of `name` from now on; the last admin cannot be revoked."""
    _check_reason(reason)
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        current = await _unrevoked(tx, name, f"operator {name} is already revoked")
        if str(current["role"]) == "admin" and await ops_sql.live_admins(tx) <= 1:
            raise Conflict(f"operator {name} is the last admin: add another admin first")
        await _check_quorum_stays_live(tx, name)
        await ops_sql.revoke(tx, name, by, reason, now_ms)
        await publish(tx, bus, "operator.revoked", name, {"reason": reason, "by": by}, now_ms)
        row = await ops_sql.get(tx, name)
    assert row is not None
    return row


async def _check_quorum_stays_live(tx: Tx, name: str, action: str = "revoking them") -> None:
    """Conflict when `name` holds an approver key whose loss would leave fewer live approvers than k: with
    k = n that would lock the quorum for good (no batch, and no change, could gather its approvals)."""
    cur = await approvers.stored(tx)
    keys = approvers.approver_keys(cur.approvers)
    why = liveness.refuse_revocation(name, keys, cur.threshold, await approvers.holders(tx), action)
    if why is not None:
        raise Conflict(why)


async def set_role(store: Store, bus: Bus | None, name: str, role: str, reason: str, by: str) -> Row:
    """Give `name` another role from its next call on; the last admin cannot be lowered.

    A lowered role also ends the operator's open streams (the Admin guard checks them again on this
    change's event), so nothing keeps showing them what the old role let them see.
    """
    check_role(role)
    _check_reason(reason)
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        current = await _unrevoked(tx, name, f"operator {name} is revoked; a revoked operator gets no role")
        old = str(current["role"])
        if old == role:
            raise Conflict(f"operator {name} already has the {role} role")
        if old == "admin" and await ops_sql.live_admins(tx) <= 1:
            raise Conflict(f"operator {name} is the last admin: make another admin first")
        if role == "viewer":  # a viewer's approver key no longer counts: the quorum must stay reachable
            await _check_quorum_stays_live(tx, name, "making them a viewer")
        await ops_sql.set_role(tx, name, role)
        await publish(tx, bus, "operator.role", name, {"from": old, "to": role, "reason": reason, "by": by}, now_ms)
        row = await ops_sql.get(tx, name)
    assert row is not None
    return row


async def list_all(store: Store) -> list[Row]:
    async with store.transaction(write=False) as tx:
        return await ops_sql.list_all(tx)


async def register_local(store: Store, cert: x509.Certificate) -> bool:
    """`bc serve`'s own operator certificate counts for `local` (an admin since the migration that made roles).

    False (and nothing stored) for a certificate that does not name `local`.
    """
    cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(cn) != 1 or cn[0].value != f"operator:{LOCAL}":
        return False
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        if await ops_sql.get(tx, LOCAL) is None:
            await ops_sql.insert(tx, LOCAL, "admin", "bc serve", now_ms)
        serial = format(cert.serial_number, "x")
        await ops_sql.add_cert(tx, serial, LOCAL, int(cert.not_valid_after_utc.timestamp() * 1000), now_ms)
    return True


def info(row: Row, now_ms: int) -> admin_pb2.OperatorInfo:
    return admin_pb2.OperatorInfo(
        name=str(row["name"]),
        role=str(row["role"]),
        created_age_ms=max(0, now_ms - int(row["created_at_ms"])),
        created_by=str(row["created_by"] or ""),
        revoked=row["revoked_at_ms"] is not None,
        revoke_reason=str(row["revoke_reason"] or ""),
        revoked_by=str(row["revoked_by"] or ""),
        certificates=int(row["certificates"] or 0),
        cert_not_after_ms=int(row["cert_not_after_ms"] or 0),
    )
