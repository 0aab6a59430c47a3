"""Tunnels on the control plane: the exec-ticket key, the tickets, and the sessions' records (docs/access.md).

* Tunnels are on once there is a key: `bc serve --tunnels` makes the first (`ensure_key`), as does `rotate`.
* The signing key (Ed25519, `bc.pki.exec_tickets`) lives beside the CA, `<data-dir>/pki/exec-tickets/<kid>.jwk`
  (0600), never in the store; the store keeps its public half (`exec_ticket_keys`), and every node's
  `access.exec_ticket_jwks` is the live keys' JWKS (`bc.control.trust.ssh.sync_access` writes it with the
  rest of the section). `ensure_key` makes the first key at `bc serve`'s start; `rotate` makes a new one and
  retires the others, so every ticket signed before is refused by every node from its next spec, and the
  nodes close the tunnels those tickets opened.
* `issue` signs one ticket for one operator, node, tunnel id (`sid`), purpose and port, for at most 5 min,
  records it (`tunnel_sessions`, state `issued`) and publishes `tunnel.ticket-issued` with who and why.
* `opened` and `ended` move the record (`open`, then `closed` or `refused`) with its bytes and exit code.

A new key set is root-equivalent on a node that holds approvers (`bc.protocol.root_equiv`), and no quorum
covers the key here: like `bc ssh ca init`, making or rotating the key is refused once approvers exist
(`ensure_key` then leaves the fleet without tunnels, and says so in the log).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
from dataclasses import dataclass
from pathlib import Path

from joserfc.jwk import OKPKey

from bc.control.base import actor
from bc.control.base.bus import Bus
from bc.control.base.events import publish
from bc.control.quorum import batches as quorum
from bc.control.signing.signer import Signer
from bc.control.trust import ssh as ssh_ctl
from bc.control.trust import typescripts
from bc.errors import Conflict, NotFound, TicketRefused, Unauthenticated, UsageError
from bc.pki import exec_tickets
from bc.pki.secrets_source import Secrets, ed25519_key
from bc.seams.ids import ulid
from bc.store import Row, Store, Tx
from bc.store import nodes as nodes_sql
from bc.store import tunnels as tunnels_sql

log = logging.getLogger("bc.control.tunnels")

MAX_REASON = 500


def key_dir(data_dir: Path) -> Path:
    return data_dir / "pki" / "exec-tickets"


def _write_key(directory: Path, key: OKPKey) -> None:
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = directory / f"{key.kid}.jwk"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(exec_tickets.key_to_json(key))
        f.flush()
        os.fsync(f.fileno())


def _read_key(directory: Path, kid: str) -> OKPKey:
    path = directory / f"{kid}.jwk"
    try:
        return exec_tickets.key_from_json(path.read_text())
    except FileNotFoundError:
        raise Conflict(
            f"the exec-ticket key {kid} is not in {directory}: this process cannot sign tickets"
            " (run it with the data dir that holds the CA, or rotate the key with `bc tunnels rotate-key`)"
        ) from None


async def jwks(tx: Tx) -> str:
    """The JWKS nodes pin: the live keys' public halves ('' when there is none)."""
    rows = await tunnels_sql.live_keys(tx)
    return exec_tickets.jwks_json([json.loads(str(r["public_jwk"])) for r in rows]) if rows else ""


async def _add_key(
    store: Store, bus: Bus, signer: Signer, directory: Path, secrets: Secrets, rng: random.Random, *, retire: bool
) -> tuple[str, list[str], int]:
    now_ms = await store.now_ms()
    kid = f"k-{ulid(now_ms / 1000, rng).lower()}"
    key = exec_tickets.new_key(kid, ed25519_key(secrets))
    await asyncio.to_thread(_write_key, directory, key)
    async with store.transaction() as tx:
        if await quorum.has_approvers(tx):
            raise Conflict(
                "approvers are registered, and a node takes a new exec-ticket key set only with their quorum,"
                " which this command cannot carry: make the key before registering approvers"
            )
        await tunnels_sql.insert_key(
            tx, kid, json.dumps(exec_tickets.public_jwk(key), sort_keys=True), actor.current(), now_ms
        )
        retired = await tunnels_sql.retire_keys_but(tx, kid, now_ms) if retire else []
        changed = await ssh_ctl.sync_access(tx, bus, signer, now_ms, lock=store.for_update())
        await publish(tx, bus, "tunnel.key-rotated", "exec-tickets", {"kid": kid, "retired": retired}, now_ms)
    return kid, retired, changed


async def ensure_key(
    store: Store, bus: Bus, signer: Signer, directory: Path, secrets: Secrets, rng: random.Random
) -> str:
    """The live key's kid, made (and pinned on every node) when there is none; '' when approvers forbid it."""
    async with store.transaction(write=False) as tx:
        live = await tunnels_sql.live_keys(tx)
        guarded = await quorum.has_approvers(tx)
    if live:
        return str(live[-1]["kid"])
    if guarded:
        log.warning("event=tunnel.no-key why=approvers-registered; tunnels are off until a quorum pins a key set")
        return ""
    kid, _retired, _n = await _add_key(store, bus, signer, directory, secrets, rng, retire=False)
    log.info("event=tunnel.key-created kid=%s", kid)
    return kid


async def rotate(
    store: Store, bus: Bus, signer: Signer, directory: Path, secrets: Secrets, rng: random.Random
) -> tuple[str, str, int]:
    """A new key; every other retired. Returns (kid, the JWKS now pinned, specs changed)."""
    kid, _retired, changed = await _add_key(store, bus, signer, directory, secrets, rng, retire=True)
    async with store.transaction(write=False) as tx:
        return kid, await jwks(tx), changed


@dataclass(frozen=True)
class TicketRequest:
    node_id: str
    purpose: str
    port: int = 0
    reason: str = ""
    ttl_s: int = 0
    record: bool = False


async def issue(
    store: Store, bus: Bus, directory: Path, rng: random.Random, secrets: Secrets, req: TicketRequest, operator: str
) -> tuple[str, exec_tickets.Ticket]:
    """Sign a ticket for `operator` and record it; (token, ticket)."""
    port, ttl = exec_tickets.check_request(req.purpose, req.port, req.reason, req.ttl_s)
    if len(req.reason) > MAX_REASON:
        raise UsageError(f"the reason is {len(req.reason)} characters long; at most {MAX_REASON}")
    async with store.transaction(write=False) as tx:
        node = await nodes_sql.get(tx, req.node_id)
        live = await tunnels_sql.live_keys(tx)
        record_policy = await typescripts.policy(tx)
    typescripts.check_promise(record_policy, req.purpose, req.record)
    if node is None:
        raise NotFound(f"no node named {req.node_id!r}")
    if node.get("revoked_at_ms"):
        raise Conflict(f"node {req.node_id} is revoked: it opens no tunnel")
    if not live:
        raise Conflict(
            "tunnels are off: there is no exec-ticket key (start `bc serve --tunnels`, or `bc tunnels rotate-key`)"
        )
    kid = str(live[-1]["kid"])
    key = await asyncio.to_thread(_read_key, directory, kid)
    now_ms = await store.now_ms()
    iat = now_ms // 1000
    t = exec_tickets.Ticket(
        jti=secrets.token_bytes(16).hex(),
        sid=f"t-{ulid(now_ms / 1000, rng).lower()}",
        node_id=req.node_id,
        operator=operator,
        purpose=req.purpose,
        port=port,
        iat_s=iat,
        exp_s=iat + ttl,
        kid=kid,
        record=req.record,
    )
    token = exec_tickets.issue(key, t)
    async with store.transaction() as tx:
        await tunnels_sql.insert_session(
            tx,
            sid=t.sid,
            jti=t.jti,
            node_id=t.node_id,
            operator=operator,
            purpose=t.purpose,
            port=t.port,
            reason=req.reason,
            kid=kid,
            issued_at_ms=now_ms,
            expires_at_ms=t.exp_ms,
            record=t.record,
        )
        data = {
            "sid": t.sid,
            "purpose": t.purpose,
            "port": t.port,
            "reason": req.reason,
            "operator": operator,
            "expires_at_ms": t.exp_ms,
            "kid": kid,
            "record": t.record,
        }
        await publish(tx, bus, "tunnel.ticket-issued", t.node_id, data, now_ms)
    return token, t


async def check_open(store: Store, token: str, operator: str) -> exec_tickets.Ticket:
    """The ticket an operator presents to open a tunnel: signed by a live key, theirs, issued and not used."""
    async with store.transaction(write=False) as tx:
        keys = await jwks(tx)
        now_ms = await store.now_ms()
        try:
            unverified = exec_tickets.peek(token)
        except TicketRefused as e:
            raise Unauthenticated(e.message) from None
        t = exec_tickets.verify(token, keys, node_id=unverified.node_id, sid=unverified.sid, now_ms=now_ms)
        row = await tunnels_sql.get_session(tx, t.sid)
    if t.operator != operator:
        raise TicketRefused("not-yours", f"this ticket was issued to {t.operator}, not to {operator}")
    if row is None or str(row["jti"]) != t.jti:
        raise TicketRefused("bad-ticket", "this ticket was not issued by this control plane")
    if str(row["state"]) != "issued":
        raise TicketRefused("replayed", f"this ticket was used already (its tunnel is {row['state']})")
    return t


async def opened(store: Store, bus: Bus, t: exec_tickets.Ticket, gateway_id: str) -> None:
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        if not await tunnels_sql.mark_open(tx, t.sid, gateway_id, now_ms):
            raise TicketRefused("replayed", "this ticket was used already, or has expired")
        data = {"sid": t.sid, "operator": t.operator, "purpose": t.purpose, "port": t.port, "gateway_id": gateway_id}
        await publish(tx, bus, "tunnel.opened", t.node_id, data, now_ms)


@dataclass(frozen=True)
class Ending:
    state: str  # closed | refused
    reason: str
    bytes_up: int = 0
    bytes_down: int = 0
    exit_code: int | None = None


async def ended(store: Store, bus: Bus, t: exec_tickets.Ticket, e: Ending) -> None:
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        changed = await tunnels_sql.mark_ended(
            tx,
            t.sid,
            e.state,
            now_ms,
            bytes_up=e.bytes_up,
            bytes_down=e.bytes_down,
            exit_code=e.exit_code,
            reason=e.reason[:MAX_REASON],
        )
        if changed:
            data = {
                "sid": t.sid,
                "operator": t.operator,
                "reason": e.reason[:MAX_REASON],
                "bytes_up": e.bytes_up,
                "bytes_down": e.bytes_down,
                "exit_code": e.exit_code,
            }
            await publish(tx, bus, f"tunnel.{e.state}", t.node_id, data, now_ms)


async def sessions(store: Store, node_id: str = "", open_only: bool = False, limit: int = 200) -> list[Row]:
    async with store.transaction(write=False) as tx:
        return await tunnels_sql.list_sessions(tx, node_id, open_only, max(1, min(limit or 200, 1000)))


async def ask_close(store: Store, bus: Bus, node_id: str, sid: str, reason: str) -> bool:
    """Ask the process that relays `sid` (maybe another) to close it; False when it is not open."""
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        if not await tunnels_sql.ask_close(tx, sid, reason):
            return False
        await publish(tx, bus, "tunnel.close-asked", node_id, {"sid": sid, "reason": reason}, now_ms)
    return True


async def close_asks(store: Store, sids: list[str]) -> dict[str, str]:
    async with store.transaction(write=False) as tx:
        return await tunnels_sql.close_asks(tx, sids)


async def session(store: Store, sid: str) -> Row:
    async with store.transaction(write=False) as tx:
        row = await tunnels_sql.get_session(tx, sid)
    if row is None:
        raise NotFound(f"no tunnel {sid[:64]!r}")
    return row
