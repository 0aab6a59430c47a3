"""`bc secret`: the secret broker's secrets (docs/secrets.md). A value goes in and is never printed back.

    bc secret set NAME @FILE|--from-env VAR [--node NODE]... [--label KEY=VALUE]... [--json]   (admin)
    bc secret list [--json]                                     names, versions, scopes, users (operator)
    bc secret versions NAME [--json]                            a secret's versions (operator)
    bc secret rm NAME [--json]                                  the secret and all its versions (admin)

A value is never taken from the command line (it would sit in the shell's history and in `ps`): `@FILE`
reads a regular file (`@-` reads stdin), `--from-env VAR` an environment variable. Names, scopes and who
set what leave through `bc.cli.output`'s escaping writer.
"""

from __future__ import annotations

import os
import sys

import click

from bc.cli.connect import run_client, slow
from bc.cli.emit import emit
from bc.cli.output import lines
from bc.cli.render import format_time_ms, render_table
from bc.client.admin import AdminClient
from bc.errors import UsageError
from bc.protocol import secret_refs
from bc.protocol.limits import LIMITS
from bc.protocol.pb import secrets_pb2
from bc.runtime.local_files import read_local_file

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")


def read_value(name: str, source: str | None, from_env: str | None) -> bytes:
    """The value from `@FILE`, `@-` or `--from-env VAR`, or one sentence why not (before any call)."""
    if (source is None) == (from_env is None):
        raise UsageError(
            f"give the value of secret {name!r} as @FILE (or @- for stdin) or --from-env VAR, exactly one of them"
        )
    if from_env is not None:
        value = os.environ.get(from_env)
        if value is None:
            raise UsageError(f"the environment has no variable {from_env!r} to read secret {name!r} from")
        data = value.encode()
    else:
        assert source is not None
        if not source.startswith("@"):
            raise UsageError(
                f"a secret's value is never taken from the command line: write @FILE (or @-) or --from-env VAR"
                f" for secret {name!r}"
            )
        path = source[1:]
        if path == "-":
            data = sys.stdin.buffer.read(LIMITS.max_local_file + 1)
            if len(data) > LIMITS.max_local_file:
                raise UsageError(f"the value on stdin is over {LIMITS.max_local_file:,} bytes (max_local_file)")
        else:
            data = read_local_file(path, f"the value file for secret {name!r}")
    if not data:
        raise UsageError(f"the value for secret {name!r} is empty")
    return data


def _scope_text(s: secrets_pb2.SecretScope) -> str:
    return ", ".join([*s.nodes, *(f"label {sel}" for sel in s.labels)]) or "(none)"


def secret_doc(s: secrets_pb2.SecretInfo) -> dict[str, object]:
    return {
        "name": s.name,
        "version": s.version,
        "scope": {"nodes": list(s.scope.nodes), "labels": list(s.scope.labels)},
        "used_by": list(s.used_by),
        "created_by": s.created_by,
        "created_at_ms": s.created_at_ms,
        "updated_by": s.updated_by,
        "updated_at_ms": s.updated_at_ms,
    }


@click.group("secret")
def secret() -> None:
    """Secrets nodes fetch by reference (docs/secrets.md); values are never printed back."""


@secret.command("set")
@click.argument("name")
@click.argument("source", required=False, metavar="@FILE|@-")
@click.option("--from-env", "from_env", metavar="VAR", help="Read the value from this environment variable.")
@click.option("--node", "nodes", multiple=True, metavar="NODE", help="A node that may read it (repeatable).")
@click.option(
    "--label", "labels", multiple=True, metavar="KEY=VALUE", help="Nodes with this label may read it (repeatable)."
)
@json_option
def secret_set(
    name: str, source: str | None, from_env: str | None, nodes: tuple[str, ...], labels: tuple[str, ...], as_json: bool
) -> None:
    """Store a new version of NAME (admin). A new secret needs a scope; without --node/--label a set keeps it."""
    secret_refs.check_name(name)
    value = read_value(name, source, from_env)

    async def go(c: AdminClient) -> secrets_pb2.SecretInfo:
        return await slow(c, c.set_secret(name, value, nodes, labels))

    info = run_client(go)
    emit(
        as_json,
        lambda: secret_doc(info),
        lambda: f"secret {info.name} version {info.version} set; nodes using it: {len(info.used_by)}",
    )


@secret.command("list")
@json_option
def secret_list(as_json: bool) -> None:
    """Every secret: its version, scope and the specs that name it (never a value)."""

    async def go(c: AdminClient) -> secrets_pb2.ListSecretsResponse:
        return await c.list_secrets()

    resp = run_client(go)
    table = render_table(
        ("NAME", "VERSION", "SCOPE", "USED BY", "UPDATED", "BY"),
        [
            (
                s.name,
                s.version,
                _scope_text(s.scope),
                ", ".join(s.used_by) or "-",
                format_time_ms(s.updated_at_ms),
                s.updated_by or "-",
            )
            for s in resp.secrets
        ],
    )
    emit(as_json, lambda: [secret_doc(s) for s in resp.secrets], table, empty="no secrets")


@secret.command("versions")
@click.argument("name")
@json_option
def secret_versions(name: str, as_json: bool) -> None:
    """NAME's versions, newest first: who set each and when (never a value)."""

    async def go(c: AdminClient) -> secrets_pb2.ListSecretVersionsResponse:
        return await c.secret_versions(name)

    resp = run_client(go)
    table = render_table(
        ("VERSION", "SET AT", "SET BY", "KEY"),
        [(v.version, format_time_ms(v.set_at_ms), v.set_by or "-", v.key_id) for v in resp.versions],
    )
    emit(
        as_json,
        lambda: [
            {"version": v.version, "set_by": v.set_by, "set_at_ms": v.set_at_ms, "key_id": v.key_id}
            for v in resp.versions
        ],
        lambda: lines(f"secret {resp.name}:", table),
    )


@secret.command("rm")
@click.argument("name")
@json_option
def secret_rm(name: str, as_json: bool) -> None:
    """Remove NAME and every version of it (admin). Nodes whose spec still names it are refused from now on."""

    async def go(c: AdminClient) -> secrets_pb2.SecretInfo:
        return await slow(c, c.remove_secret(name))

    info = run_client(go)
    still = f"; still named by {', '.join(info.used_by)}" if info.used_by else ""
    emit(as_json, lambda: secret_doc(info), lambda: f"secret {info.name} removed{still}")


COMMANDS: tuple[click.Command, ...] = (secret,)
