"""What a keyless gateway takes from the store: its serving certificate, the published trust, api addresses;
and the spec generations that wait for a key-holding process to sign them."""

from __future__ import annotations

from bc.store.base import Row, Tx
from bc.store.leases import Claim

# -- serving certificates ---------------------------------------------------------------------------------


async def request_serving_cert(
    tx: Tx, gateway_id: str, hosts: str, csr_pem: str, now_ms: int, claim: Claim | None = None
) -> bool:
    """Ask for a serving certificate (a first one or a renewal); the current one stays until it is replaced.

    With `claim`, only while that claim still holds the gateway's lease at its epoch: a second process under
    the same gateway id, fenced by the lease, cannot ask for a certificate for its own key and so start a
    re-issue loop with the one that holds it. False when refused."""
    fence, args = " WHERE 1 = 1", {"g": gateway_id, "h": hosts, "c": csr_pem, "t": now_ms}
    if claim is not None:
        fence = (
            " WHERE EXISTS (SELECT 1 FROM leases WHERE name = :ln AND holder = :lh AND epoch = :le"
            " AND expires_at_ms > :t)"
        )
        args |= {"ln": claim.name, "lh": claim.holder, "le": claim.epoch}
    # The SELECT has a WHERE either way: SQLite reads `SELECT … ON CONFLICT` as a join without one.
    n = await tx.execute(
        "INSERT INTO serving_certs (gateway_id, hosts, csr_pem, requested_at_ms) SELECT :g, :h, :c, :t"
        + fence
        + (
            " ON CONFLICT (gateway_id) DO UPDATE SET hosts = excluded.hosts, csr_pem = excluded.csr_pem,"
            " requested_at_ms = excluded.requested_at_ms"
        ),
        args,
    )
    return n == 1


async def serving_cert(tx: Tx, gateway_id: str) -> Row | None:
    return await tx.fetchone(
        "SELECT gateway_id, hosts, csr_pem, requested_at_ms, cert_pem, issued_at_ms, not_after_ms"
        " FROM serving_certs WHERE gateway_id = :g",
        {"g": gateway_id},
    )


async def serving_requests(tx: Tx) -> list[Row]:
    """Requests no certificate answers yet (never issued, or asked again since)."""
    return await tx.fetchall(
        "SELECT gateway_id, hosts, csr_pem, requested_at_ms FROM serving_certs"
        " WHERE issued_at_ms IS NULL OR issued_at_ms < requested_at_ms ORDER BY gateway_id"
    )


async def issue_serving_cert(
    tx: Tx, gateway_id: str, requested_at_ms: int, cert_pem: str, not_after_ms: int, now_ms: int
) -> bool:
    """Answer the request made at `requested_at_ms` (a newer one is left for the next pass)."""
    n = await tx.execute(
        "UPDATE serving_certs SET cert_pem = :c, issued_at_ms = :t, not_after_ms = :na"
        " WHERE gateway_id = :g AND requested_at_ms = :r",
        {"c": cert_pem, "t": max(now_ms, requested_at_ms), "na": not_after_ms, "g": gateway_id, "r": requested_at_ms},
    )
    return n == 1


# -- published trust ------------------------------------------------------------------------------------


async def put_published(tx: Tx, name: str, value: bytes, now_ms: int) -> None:
    await tx.execute(
        "INSERT INTO published_trust (name, value, updated_at_ms) VALUES (:n, :v, :t)"
        " ON CONFLICT (name) DO UPDATE SET value = excluded.value, updated_at_ms = excluded.updated_at_ms",
        {"n": name, "v": value, "t": now_ms},
    )


async def published(tx: Tx) -> dict[str, bytes]:
    rows = await tx.fetchall("SELECT name, value FROM published_trust")
    return {str(r["name"]): bytes(r["value"]) for r in rows}


async def signing_on(tx: Tx) -> bool:
    """Whether this install signs intent: a worker certificate has been registered (it is never removed)."""
    return int(await tx.fetchval("SELECT COUNT(*) FROM signing_certs")) != 0


# -- api addresses --------------------------------------------------------------------------------------


async def register_api(tx: Tx, holder: str, address: str, now_ms: int, ttl_ms: int) -> None:
    await tx.execute(
        "INSERT INTO api_endpoints (holder, address, expires_at_ms) VALUES (:h, :a, :e)"
        " ON CONFLICT (holder) DO UPDATE SET address = excluded.address, expires_at_ms = excluded.expires_at_ms",
        {"h": holder, "a": address, "e": now_ms + ttl_ms},
    )


async def unregister_api(tx: Tx, holder: str) -> None:
    await tx.execute("DELETE FROM api_endpoints WHERE holder = :h", {"h": holder})


async def api_addresses(tx: Tx, now_ms: int) -> list[str]:
    rows = await tx.fetchall(
        "SELECT address FROM api_endpoints WHERE expires_at_ms > :now ORDER BY expires_at_ms DESC", {"now": now_ms}
    )
    return [str(r["address"]) for r in rows]


# -- gateway addresses (tunnels relayed between processes: docs/access.md) ---------------------------------


async def register_gateway(tx: Tx, gateway_id: str, address: str, now_ms: int, ttl_ms: int) -> None:
    await tx.execute(
        "INSERT INTO gateway_endpoints (gateway_id, address, expires_at_ms) VALUES (:g, :a, :e)"
        " ON CONFLICT (gateway_id) DO UPDATE SET address = excluded.address, expires_at_ms = excluded.expires_at_ms",
        {"g": gateway_id, "a": address, "e": now_ms + ttl_ms},
    )


async def unregister_gateway(tx: Tx, gateway_id: str) -> None:
    await tx.execute("DELETE FROM gateway_endpoints WHERE gateway_id = :g", {"g": gateway_id})


async def session_route(tx: Tx, node_id: str, now_ms: int) -> tuple[str, str] | None:
    """The gateway holding `node_id`'s open session and where it answers, while its registration is live;
    (gateway id, "") when the gateway registered no live address; None when the node has no open session."""
    row = await tx.fetchone(
        "SELECT s.gateway_id, e.address FROM node_sessions s LEFT JOIN gateway_endpoints e"
        " ON e.gateway_id = s.gateway_id AND e.expires_at_ms > :now WHERE s.node_id = :n AND s.open = 1",
        {"n": node_id, "now": now_ms},
    )
    if row is None:
        return None
    return str(row["gateway_id"]), str(row["address"] or "")


# -- specs waiting for a signature ----------------------------------------------------------------------


async def specs_to_sign(tx: Tx, limit: int = 500) -> list[Row]:
    return await tx.fetchall(
        "SELECT node_id, generation, spec_body FROM nodes WHERE spec_sign_pending = 1 AND spec_body IS NOT NULL"
        " ORDER BY node_id LIMIT :l",
        {"l": limit},
    )


async def sign_spec(tx: Tx, node_id: str, generation: int, signature: bytes | None, key_id: str) -> bool:
    """Sign the stored generation only (a bump in between wrote its own, pending or signed)."""
    n = await tx.execute(
        "UPDATE nodes SET spec_signature = :s, spec_key_id = :k, spec_sign_pending = 0"
        " WHERE node_id = :n AND generation = :g AND spec_sign_pending = 1",
        {"s": signature, "k": key_id, "n": node_id, "g": generation},
    )
    return n == 1
