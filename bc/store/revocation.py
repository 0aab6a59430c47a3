"""Certificate revocation and the node certificates that attested results are checked against."""

from __future__ import annotations

from bc.store.base import Row, Tx, id_range


async def revoke_node(tx: Tx, node_id: str, reason: str, now_ms: int) -> list[str]:
    """Revoke every live certificate of the node, its session certificates (`bc.pki.session_cert`) among them;
    returns the serials revoked now."""
    rows = await tx.fetchall(
        "UPDATE node_certs SET revoked_at_ms = :t, revoke_reason = :r"
        " WHERE node_id = :n AND revoked_at_ms IS NULL RETURNING serial",
        {"t": now_ms, "r": reason, "n": node_id},
    )
    return [str(r["serial"]) for r in rows]


async def revoked_among(tx: Tx, serials: list[str]) -> list[Row]:
    """Which of these serials are revoked (the gateway's revocation feed asks for its sessions')."""
    out: list[Row] = []
    for i in range(0, len(serials), 500):
        chunk = serials[i : i + 500]
        params = {f"s{j}": s for j, s in enumerate(chunk)}
        names = ", ".join(f":s{j}" for j in range(len(chunk)))
        out += await tx.fetchall(
            f"SELECT serial, node_id, revoke_reason FROM node_certs WHERE revoked_at_ms IS NOT NULL"
            f" AND serial IN ({names})",
            params,
        )
    return out


async def revoked_since(tx: Tx, since_ms: int) -> list[Row]:
    """Certificates revoked at or after `since_ms` (store time): the revocation feed's poll."""
    return await tx.fetchall(
        "SELECT serial, node_id, revoke_reason, revoked_at_ms FROM node_certs"
        " WHERE revoked_at_ms IS NOT NULL AND revoked_at_ms >= :t",
        {"t": since_ms},
    )


async def live_certs(tx: Tx, node_id: str, limit: int = 8) -> list[str]:
    """PEMs of the node's unrevoked certificates of its current identity, newest first: up to `limit` node
    certificates, then up to `limit` session certificates (a TPM identity signs its reports with the TPM key
    and its results with the session key; a node restarted often must not push its node certificates out)."""
    pems: list[str] = []
    for kind in ("IS NULL", "IS NOT NULL"):
        rows = await tx.fetchall(
            "SELECT c.cert_pem FROM node_certs c JOIN nodes n ON n.node_id = c.node_id"
            " WHERE c.node_id = :n AND c.revoked_at_ms IS NULL AND c.identity_generation = n.identity_generation"
            f" AND c.session_of {kind} ORDER BY c.issued_at_ms DESC LIMIT :l",
            {"n": node_id, "l": limit},
        )
        pems += [str(r["cert_pem"]) for r in rows]
    return pems


CertState = tuple[int | None, int, str | None, int]
"""A node's certificates of one identity generation, as `cert_states` reads them: the newest expiry, how many
are unrevoked, a revocation reason if any, how many there are (as `cert_state`'s row: `not_after_ms`, `live`,
`revoke_reason`, `total`)."""


async def cert_states(
    tx: Tx, *, after: str | None = None, through: str | None = None
) -> dict[tuple[str, int], CertState]:
    """Per node and identity generation: its newest certificate's expiry, how many of its certificates are
    unrevoked, and a revocation reason if any (node certificates only: session certificates go with them).
    The caller picks the node's current generation from the node's row, which it reads anyway (the fleet
    listing): joined here to `nodes` for it, this read took twice as long, each certificate looking its
    node's row up.

    Of the nodes whose id is > `after` and <= `through` where given (a page of the listing: its bounds);
    `cert_state` reads one node's."""
    where, params = id_range("node_id", after, through)
    rows = await tx.fetchtuples(
        "SELECT node_id, identity_generation, MAX(not_after_ms),"
        " SUM(CASE WHEN revoked_at_ms IS NULL THEN 1 ELSE 0 END), MAX(revoke_reason), COUNT(*)"
        f" FROM node_certs WHERE session_of IS NULL{where}"
        " GROUP BY node_id, identity_generation",
        params,
    )
    return {
        (node_id, int(gen)): (not_after, int(live), reason, int(total))
        for node_id, gen, not_after, live, reason, total in rows
    }


async def cert_state(tx: Tx, node_id: str) -> Row | None:
    """`cert_states` of one node (None: it has no certificate), without reading the fleet's."""
    rows = await tx.fetchall(
        "SELECT c.node_id, MAX(c.not_after_ms) AS not_after_ms,"
        " SUM(CASE WHEN c.revoked_at_ms IS NULL THEN 1 ELSE 0 END) AS live,"
        " MAX(c.revoke_reason) AS revoke_reason, COUNT(*) AS total"
        " FROM node_certs c JOIN nodes n ON n.node_id = c.node_id"
        " WHERE c.node_id = :n AND c.identity_generation = n.identity_generation AND c.session_of IS NULL"
        " GROUP BY c.node_id",
        {"n": node_id},
    )
    return rows[0] if rows else None


async def identity_started_ms(tx: Tx, node_id: str) -> int:
    """When the node's current identity got its first certificate (0 if it has none)."""
    v = await tx.fetchval(
        "SELECT MIN(c.issued_at_ms) FROM node_certs c JOIN nodes n ON n.node_id = c.node_id"
        " WHERE c.node_id = :n AND c.identity_generation = n.identity_generation",
        {"n": node_id},
    )
    return int(v or 0)
