"""`bc ssh`: break-glass SSH certificates under a CA every node trusts (docs/ssh.md).

    bc ssh ca init [--offline-key FILE] [--json]   the SSH user CA (key 0600 in the server's data dir, or
                                                   in FILE on this machine), on every node
    bc ssh ca show [--json]
    bc ssh grant NODE --principal P --pubkey FILE [--ttl 30m] [--reason TEXT] [--wait] [--ca-key FILE] [--json]
    bc ssh cert SERIAL|BATCH [--ca-key FILE] [--json]   a grant's certificate (once its batch's quorum approved)
    bc ssh revoke SERIAL [--reason TEXT] [--json]
    bc ssh list [--node N] [--live] [--json]

`bc ssh grant` prints the certificate line on stdout (redirect it to
`~/.ssh/id_ed25519-cert.pub`) and what it grants on stderr. A `root` grant is
a batch the quorum approves first: it prints the batch id and how to fetch the
certificate, or with `--wait` waits for the decision and prints the
certificate then. Under an offline CA, `--ca-key FILE` signs on this machine
and the server records the certificate after checking it is exactly the grant's.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import click
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from bc.cli.connect import run_client
from bc.cli.emit import emit
from bc.cli.output import Lines, echo, lines
from bc.cli.render import cell, format_time_ms, parse_duration, render_fields, render_table
from bc.client.admin import AdminClient
from bc.control.trust.ssh import DEFAULT_TTL_S, MAX_TTL_S
from bc.errors import Conflict, UsageError
from bc.pki import ssh as ssh_pki
from bc.pki.secrets_source import SystemSecrets, ed25519_key
from bc.protocol import ssh_lines
from bc.protocol.pb import admin_pb2
from bc.runtime.local_files import read_local_text

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
WAIT_POLL_S = 1.0


@click.group("ssh")
def ssh() -> None:
    """Break-glass SSH: a CA the nodes trust, short-lived certificates, revocation."""


@ssh.group("ca")
def ca() -> None:
    """The SSH user CA."""


def _render_ca(c: admin_pb2.SshCaInfo) -> Lines:
    if not c.public_key:
        return lines("no SSH CA yet: bc ssh ca init")
    return render_fields(
        [
            ("fingerprint", c.fingerprint),
            ("public key", c.public_key),
            ("key file", c.key_path or "offline (bc ssh grant --ca-key FILE signs on your machine)"),
            ("created", f"{format_time_ms(c.created_at_ms)} by {c.created_by or '-'}"),
        ]
    )


@ca.command("init")
@click.option(
    "--offline-key",
    type=click.Path(path_type=Path),
    default=None,
    help="Make the CA key here (0600), on this machine, and give the server only its public half.",
)
@json_option
def ca_init(offline_key: Path | None, as_json: bool) -> None:
    """Make the SSH user CA once; its public key goes into every node's access section."""
    if offline_key is None:
        info = run_client(lambda c: c.ssh_ca_init())
    else:
        info = run_client(lambda c: _init_offline(c, offline_key))
    emit(as_json, info, lambda: _render_ca(info))


async def _init_offline(client: AdminClient, path: Path) -> admin_pb2.SshCaInfo:
    """Make the key file, register its public half; the file goes again if the server refuses it."""
    existing = await client.get_ssh_ca()
    if existing.public_key:
        raise Conflict(f"an SSH CA exists already ({existing.fingerprint}); it is never replaced by init")
    key = ed25519_key(SystemSecrets())
    await asyncio.to_thread(ssh_pki.write_key_file, path, key)  # refused (Conflict) when the file exists
    try:
        return await client.ssh_ca_init(public_key=ssh_pki.public_line(key))
    except BaseException:
        await asyncio.to_thread(_remove_key_file, path)
        raise


def _remove_key_file(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.with_name(path.name + ".pub").unlink(missing_ok=True)


def load_offline_key(path: Path, ca: admin_pb2.SshCaInfo) -> Ed25519PrivateKey:
    """The offline CA's key from `path` (0600), checked to be the CA the cluster trusts."""
    if not ca.public_key:
        raise Conflict("there is no SSH CA yet: run `bc ssh ca init` first")
    if not ca.offline:
        raise UsageError("the server holds the SSH CA key: --ca-key is for an offline CA")
    key = ssh_pki.load_ca_key(path)
    if ssh_pki.public_line(key) != ca.public_key:
        raise UsageError(f"{path} is not the key of this cluster's SSH CA ({ca.fingerprint})")
    return key


async def _sign_offline(
    client: AdminClient, g: admin_pb2.SshGrantInfo, key: Ed25519PrivateKey
) -> admin_pb2.SshGrantInfo:
    """Sign a signable grant here with the offline CA key, for exactly its serial, principal, key and window."""
    cert = ssh_pki.sign_user_cert(
        key,
        ssh_pki.parse_public_key(g.public_key),
        serial=g.serial,
        key_id=f"bc:{g.requested_by or '-'}:{g.login}",
        principals=[g.login],
        valid_after_s=g.valid_after_ms // 1000,
        valid_before_s=g.valid_before_ms // 1000,
    )
    return await client.ssh_record_cert(g.serial, cert)


@ca.command("show")
@json_option
def ca_show(as_json: bool) -> None:
    """The SSH user CA's public key and fingerprint."""
    info = run_client(lambda c: c.get_ssh_ca())
    emit(as_json, info, lambda: _render_ca(info))


def read_pubkey(path: Path) -> str:
    """The file's text, checked to be exactly one SSH public key (one sentence otherwise)."""
    try:
        text = read_local_text(path, "the public key file")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read the public key file {path}: {getattr(e, 'strerror', None) or e}") from None
    ssh_pki.parse_public_key(text, f"the public key file {path}")
    return text


def parse_ttl(text: str) -> int:
    seconds = parse_duration(text, what="TTL")
    if seconds > MAX_TTL_S:
        raise UsageError(f"the TTL {text!r} is over the maximum of 8h")
    return seconds


def _summary(g: admin_pb2.SshGrantInfo) -> str:
    if g.state == "issued":
        return (
            f"certificate serial {g.serial} for {g.login} (key {g.fingerprint}), valid until"
            f" {format_time_ms(g.valid_before_ms)}; revoke with `bc ssh revoke {g.serial}`"
        )
    if g.signable:
        return (
            f"grant {g.serial} for {g.login} waits for the offline CA's signature: bc ssh cert {g.serial} --ca-key FILE"
        )
    if g.state == "pending":
        return (
            f"{g.login} is a destructive-scope principal: batch {g.batch_id} waits for its quorum"
            f" (bc approve show {g.batch_id}); then `bc ssh cert {g.batch_id}` prints the certificate"
        )
    return f"grant {g.serial} for {g.login} was refused (batch {g.batch_id} is {g.batch_state or 'settled'})"


@ssh.command("grant")
@click.argument("node_id")
@click.option("--principal", required=True, help="The local user to log in as (the certificate says USER@NODE).")
@click.option("--pubkey", "pubkey", type=click.Path(path_type=Path), required=True, help="The user's .pub file.")
@click.option("--ttl", default="30m", show_default=True, help="How long the certificate is valid (at most 8h).")
@click.option("--reason", default="", help="Why (recorded in the grant's event).")
@click.option("--wait", is_flag=True, help="For a root grant: wait for the quorum, then print the certificate.")
@click.option("--timeout", default="1h", show_default=True, help="How long --wait waits.")
@click.option("--ca-key", type=click.Path(path_type=Path), default=None, help="An offline CA's key: sign here.")
@json_option
def grant(
    node_id: str,
    principal: str,
    pubkey: Path,
    ttl: str,
    reason: str,
    wait: bool,
    timeout: str,
    ca_key: Path | None,
    as_json: bool,
) -> None:
    """Sign a short-lived SSH certificate for PRINCIPAL@NODE_ID and print it."""
    why = ssh_lines.principal_problem(principal)
    if why is not None:
        raise UsageError(f"the principal {principal!r} {why}")
    ttl_s = parse_ttl(ttl) if ttl else DEFAULT_TTL_S
    wait_s = parse_duration(timeout, what="timeout")
    request = admin_pb2.SshGrantRequest(
        node_id=node_id, principal=principal, public_key=read_pubkey(pubkey), ttl_s=ttl_s, reason=reason
    )

    async def go(client: AdminClient) -> admin_pb2.SshGrantInfo:
        ca = await client.get_ssh_ca()
        key = load_offline_key(ca_key, ca) if ca_key is not None else None
        if ca.offline and key is None:
            raise UsageError("the SSH CA is offline: pass its key with --ca-key FILE to sign here")
        g = await client.ssh_grant(request)
        if g.state == "pending" and not g.signable and wait:
            echo(_summary(g), err=True)
            g = await _wait(client, g, wait_s)
        if g.signable and key is not None:
            g = await _sign_offline(client, g, key)
        return g

    g = run_client(go)
    _show_grant(g, as_json)


async def _wait(client: AdminClient, g: admin_pb2.SshGrantInfo, wait_s: float) -> admin_pb2.SshGrantInfo:
    """Ask the server again each second until the batch is decided, for at most `wait_s` (the loop's clock)."""
    try:
        async with asyncio.timeout(wait_s):
            while g.state == "pending" and not g.signable and not g.revoked_at_ms:
                await asyncio.sleep(WAIT_POLL_S)  # a poll of the server, not a wait for time to pass
                g = await client.get_ssh_grant(serial=g.serial)
    except TimeoutError:
        raise Conflict(
            f"batch {g.batch_id} was not decided within {wait_s:.0f} s; `bc ssh cert {g.batch_id}` later"
        ) from None
    return g


def _show_grant(g: admin_pb2.SshGrantInfo, as_json: bool) -> None:
    if as_json:
        emit(True, g)
        return
    echo(_summary(g), err=True)
    if g.state == "issued":
        echo(g.certificate)
    elif g.state == "refused":
        raise Conflict(_summary(g))


@ssh.command("cert")
@click.argument("ref")
@click.option("--ca-key", type=click.Path(path_type=Path), default=None, help="An offline CA's key: sign here.")
@json_option
def cert(ref: str, ca_key: Path | None, as_json: bool) -> None:
    """A grant's certificate, by serial or by its batch (signed once the quorum approved)."""
    batch_id = ref if ref.startswith("b-") else ""
    serial = 0 if batch_id else parse_serial(ref)

    async def go(client: AdminClient) -> admin_pb2.SshGrantInfo:
        g = await client.get_ssh_grant(serial=serial, batch_id=batch_id)
        if g.signable and ca_key is not None:
            g = await _sign_offline(client, g, load_offline_key(ca_key, await client.get_ssh_ca()))
        return g

    g = run_client(go)
    if g.signable and not as_json:
        raise Conflict(_summary(g))
    if g.state == "pending" and not as_json:
        raise Conflict(f"batch {g.batch_id} ({g.batch_state}) has not been approved yet: no certificate for {g.login}")
    _show_grant(g, as_json)


def parse_serial(text: str) -> int:
    n = ssh_lines.parse_serial(text.strip())
    if n is None:
        raise UsageError(f"{text!r} is not a certificate serial (a decimal number, as `bc ssh list` shows)")
    return n


@ssh.command("revoke")
@click.argument("serial")
@click.option("--reason", default="", help="Why (recorded in the event).")
@json_option
def revoke(serial: str, reason: str, as_json: bool) -> None:
    """Revoke a certificate: every node's KRL lists its serial within one converge pass."""
    n = parse_serial(serial)
    g = run_client(lambda c: c.ssh_revoke(n, reason=reason))
    emit(as_json, g, f"revoked serial {g.serial} ({g.login}); every node's KRL lists it after its next pass")


def _state(g: admin_pb2.SshGrantInfo, now_ms: int) -> str:
    if g.revoked_at_ms:
        return "revoked"
    if g.state == "issued" and g.valid_before_ms <= now_ms:
        return "expired"
    return g.state


@ssh.command("list")
@click.option("--node", "node_id", default="", help="Only this node's grants.")
@click.option("--live", is_flag=True, help="Only issued certificates that are neither revoked nor expired.")
@json_option
def list_(node_id: str, live: bool, as_json: bool) -> None:
    """Every grant: serial, login, key, state, who asked and why."""

    async def go(client: AdminClient) -> tuple[list[admin_pb2.SshGrantInfo], int]:
        return await client.list_ssh_grants(node_id=node_id, live_only=live), (
            await client.server_info()
        ).server_time_ms

    grants, now_ms = run_client(go)
    rows = [
        (
            g.serial,
            g.login,
            g.fingerprint,
            _state(g, now_ms),
            format_time_ms(g.valid_before_ms) if g.valid_before_ms else "-",
            g.requested_by,
            cell(g.reason or "-", width=40),
        )
        for g in grants
    ]
    headers = ("SERIAL", "LOGIN", "KEY", "STATE", "VALID UNTIL", "BY", "REASON")
    emit(as_json, grants, lambda: render_table(headers, rows), empty="no SSH certificates")


COMMANDS: tuple[click.Command, ...] = (ssh,)
