"""`bc operators`: named people with roles, each with their own client certificate.

`bc operators add NAME` makes the person's key here, has the server certify it
for NAME with a role, and writes one self-contained client config (0600, the
key inside) to hand to that person: `BC_CONFIG=FILE bc nodes` then works from
their shell. The key never crosses the wire; the file is the only copy.
"""

from __future__ import annotations

from pathlib import Path

import click
from cryptography.hazmat.primitives import serialization

from bc.cli.admin_cmds import call_admin, json_option
from bc.cli.emit import emit
from bc.cli.output import Lines, lines
from bc.cli.render import format_age, format_time_ms, render_table
from bc.control.base.actor import ROLES
from bc.control.trust.operators import DEFAULT_ROLE
from bc.errors import BcError, UsageError
from bc.pki import keys
from bc.pki.identity import check_safe_name
from bc.protocol.pb import admin_pb2
from bc.runtime.config import OperatorConfig, find_operator_config


@click.group("operators", invoke_without_command=True)
@json_option
@click.pass_context
def operators(ctx: click.Context, as_json: bool) -> None:
    """Operators and their roles (`bc operators list|add|role|revoke`): viewer < operator < admin."""
    if ctx.invoked_subcommand is None:
        _show(call_admin(lambda c: c.list_operators()), as_json)


def _show(ops: list[admin_pb2.OperatorInfo], as_json: bool) -> None:
    emit(as_json, ops, lambda: render_operators(ops))


def render_operators(ops: list[admin_pb2.OperatorInfo]) -> Lines:
    rows = [
        (
            o.name,
            o.role,
            f"revoked by {o.revoked_by or '?'}: {o.revoke_reason or 'no reason given'}" if o.revoked else "active",
            o.certificates,
            format_time_ms(o.cert_not_after_ms) if o.cert_not_after_ms else "-",
            f"{format_age(o.created_age_ms)} by {o.created_by or '?'}",
        )
        for o in ops
    ]
    return render_table(("NAME", "ROLE", "STATE", "CERTS", "CERT EXPIRES", "ADDED"), rows)


@operators.command("list")
@json_option
def operators_list(as_json: bool) -> None:
    """Every operator, revoked ones included (their names are never reused)."""
    _show(call_admin(lambda c: c.list_operators()), as_json)


@operators.command("add")
@click.argument("name")
@click.option("--role", type=click.Choice(ROLES), default=DEFAULT_ROLE, show_default=True)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Where to write the person's client config (default ./NAME.bc-config.json; never overwritten).",
)
@json_option
def operators_add(name: str, role: str, out: Path | None, as_json: bool) -> None:
    """Add operator NAME with a role and write the client config to hand to that person."""
    check_safe_name("operator name", name)  # before it becomes part of a file name
    out = out or Path(f"{name}.bc-config.json")
    local = find_operator_config()
    key = keys.generate_key()
    key_pem = keys.key_to_pem(key)
    # The key reaches F before the server commits the operator: a file we cannot write (exists, no such
    # directory, unwritable) stops here with nothing added, and no operator ever exists whose key is lost.
    OperatorConfig.write_single(out, server=local.server, ca_pem=local.ca_pem, cert_pem=b"", key_pem=key_pem)
    pub = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    try:
        resp = call_admin(lambda c: c.add_operator(name, role, pub))
    except BaseException:
        out.unlink(missing_ok=True)  # nothing was added: the key is for no one
        raise
    try:
        OperatorConfig.replace_single(
            out, server=local.server, ca_pem=resp.ca_pem, cert_pem=resp.cert_pem, key_pem=key_pem
        )
    except UsageError as e:
        rolled_back = _roll_back(name)
        raise UsageError(
            f"operator {name} was added but its config could not be completed ({e.message}); {rolled_back}"
        ) from None
    emit(
        as_json,
        {"operator": resp.operator, "config": str(out)},
        lines(
            f"operator {name} added as {role}; its client config is {out} (0600, it holds the private key)",
            f"hand it to {name} over a private channel; they run: BC_CONFIG={out} bc nodes",
        ),
    )


def _roll_back(name: str) -> str:
    """Revoke an operator whose config could not be written: nobody holds its certificate."""
    try:
        call_admin(lambda c: c.revoke_operator(name, reason="bc operators add could not write its config"))
    except BcError as e:
        return f"revoking it failed too ({e.message}): run bc operators revoke {name}"
    return f"so it was revoked (a name is never reused): add {name} again under another name"


@operators.command("revoke")
@click.argument("name")
@click.option("--reason", default="", help="Why: stored and shown in `bc operators list`.")
@json_option
def operators_revoke(name: str, reason: str, as_json: bool) -> None:
    """Refuse every certificate of operator NAME from now on (the last admin cannot be revoked)."""
    info = call_admin(lambda c: c.revoke_operator(name, reason=reason))
    emit(as_json, info, f"operator {info.name} is revoked: every gateway refuses its certificates from now on")


@operators.command("role")
@click.argument("name")
@click.argument("role", type=click.Choice(ROLES))
@click.option("--reason", default="", help="Why: stored in the operator.role event.")
@json_option
def operators_role(name: str, role: str, reason: str, as_json: bool) -> None:
    """Give operator NAME another ROLE; a lowered role also closes their open Watch, `events --follow`
    and TUI streams (the last admin cannot be lowered)."""
    info = call_admin(lambda c: c.set_operator_role(name, role, reason=reason))
    emit(as_json, info, f"operator {info.name} now has the {info.role} role")


COMMANDS: tuple[click.Command, ...] = (operators,)
