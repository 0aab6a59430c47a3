"""`bc release`: signed releases and the self-update of nodes (docs/self-update.md).

    bc release key add --key release.key [--generate] [--root-key FILE]   # trust a release key (root-signed)
    bc release publish dist/bc-1.4.0-linux-x86_64 --key release.key [--version V] [--name N] [--platform P]
                       [--url https://…]
    bc release rollout 1.4.0 --nodes n1,n2,… [--max-unavailable 2] [--no-wait]
    bc release status
    bc release RESERVATION                                  # as before: give a reservation back

`publish` asks `bc serve` for the next sequence of the release's name, signs
name, version, sequence, platform, sha256 and size locally (the key never
leaves this host) and uploads it to `bc serve`, which keeps it and serves it over HTTPS
(`bc serve --release-listen`); with `--url` the file stays where it is and
only the record is stored. `rollout` is the `release` job template:
`daemon.upgrade` node by node, at most `--max-unavailable` at once, stopping
on the first failure.
"""

from __future__ import annotations

import re
from pathlib import Path

import click
from google.protobuf import json_format

from bc.cli.admin_cmds import ROOT_KEY_OPTION
from bc.cli.admin_cmds import release as reservation_release
from bc.cli.connect import run_client, slow
from bc.cli.emit import emit
from bc.cli.job_cmds import submit_and_follow
from bc.cli.job_progress import check_done, job_to_json, progress_line
from bc.cli.output import Lines, lines
from bc.cli.render import cell, format_time_ms, render_table
from bc.client.admin import AdminClient
from bc.errors import NotFound, UsageError
from bc.pki import releases as rel
from bc.pki.releases import upgrade_request
from bc.protocol.pb import admin_pb2

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
_FILE = click.Path(path_type=Path, dir_okay=False)
FILE_RE = re.compile(r"(?P<name>[a-z0-9][a-z0-9._]*)-(?P<version>.+)-(?P<platform>linux-[^-]+)")


class _ReleaseGroup(click.Group):
    """`bc release RESERVATION` still gives a reservation back (bc.cli.admin_cmds): a first argument that is
    no subcommand of this group is that older form."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        if args and not args[0].startswith("-") and args[0] not in self.commands:
            return "release", reservation_release, args
        return super().resolve_command(ctx, args)


@click.group("release", cls=_ReleaseGroup)
def release() -> None:
    """Signed releases: key add, publish, rollout (daemon.upgrade), status.

    `bc release RESERVATION` gives a reservation's devices back, as before."""


@release.group("key")
def key() -> None:
    """The Ed25519 keys whose signatures nodes accept on a release."""


@key.command("add")
@click.option("--key", "key_path", type=_FILE, required=True, help="The release key (private or public PEM).")
@click.option("--generate", is_flag=True, help="Make a new private key in --key first (0600; never overwritten).")
@ROOT_KEY_OPTION
@json_option
def key_add(key_path: Path, generate: bool, root_key: Path | None, as_json: bool) -> None:
    """Trust a release key: it reaches every node in the trust bundle, under the signing root's signature.

    With the root key kept off the bc serve host, pass it with --root-key: it signs the release key here
    (checked against the server's root first, before --generate writes anything) and is never sent.
    """

    async def go(c: AdminClient) -> admin_pb2.ReleaseKeyInfo:
        signing_key = None
        if root_key is not None:
            from bc.pki.root_offline import load_root_key

            pki = await slow(c, c.get_pki())
            signing_key = load_root_key(root_key, pki.roots[0].cert_pem if pki.roots else "")
        if generate:
            rel.generate_key(key_path)
        public = rel.load_public(key_path)
        if signing_key is None:
            return await slow(c, c.add_release_key(public))
        # AddReleaseKeyRequest.root_signature: the root's endorsement of the key, made on this machine.
        request = admin_pb2.AddReleaseKeyRequest(public_key=public, root_signature=rel.endorse(signing_key, public))
        return await slow(c, c._unary("AddReleaseKey", request, admin_pb2.ReleaseKeyInfo))

    info = run_client(go)
    emit(
        as_json,
        info,
        f"release key {info.key_id} trusted" + (f"; private key written to {key_path}" if generate else ""),
    )


def fields_from_name(path: Path) -> tuple[str, str, str]:
    """(name, version, platform) from `NAME-VERSION-linux-ARCH`; empty strings where the name says nothing."""
    m = FILE_RE.fullmatch(path.name)
    if m is None:
        return "", "", ""
    return m.group("name"), m.group("version"), m.group("platform")


@release.command("publish")
@click.argument("path", type=_FILE)
@click.option("--key", "key_path", type=_FILE, required=True, help="The release key that signs it.")
@click.option("--version", "version", default="", help="The release's version (default: from the file's name).")
@click.option("--name", "name", default="", help="The release's name (default: from the file's name, else bc).")
@click.option("--platform", "platform", default="", help="linux-ARCH (default: from the file's name).")
@click.option("--url", default="", help="Where nodes fetch it (https://); default: uploaded to and served by bc serve.")
@json_option
def publish(path: Path, key_path: Path, version: str, name: str, platform: str, url: str, as_json: bool) -> None:
    """Sign PATH with --key and store its release record (and the file, unless --url).

    The signature covers the name, version, sequence (the next of that name, asked of bc serve first),
    platform, sha256 and size."""
    if not path.is_file():
        raise UsageError(f"{path} is not a file")
    from_name = fields_from_name(path)
    version = version or from_name[1]
    if not version:
        raise UsageError(f"cannot tell the version from {path.name!r} (not bc-VERSION-linux-ARCH): give --version")
    name = name or from_name[0] or rel.DEFAULT_NAME
    platform = platform or from_name[2]
    if not platform:
        raise UsageError(f"cannot tell the platform from {path.name!r} (not bc-VERSION-linux-ARCH): give --platform")
    if url and not url.startswith("https://"):
        raise UsageError(f"the release URL {url!r} is not an https:// URL; nodes fetch releases over https only")
    signing_key = rel.load_key(key_path)
    sha256, size = rel.file_digest(path)
    try:
        rel.Release(name, version, 1, platform, sha256, size).check()  # before anything is asked of bc serve
    except rel.BadRelease as e:
        raise UsageError(str(e)) from None

    async def go(c: AdminClient) -> admin_pb2.ReleaseInfo:
        sequence = (await slow(c, c.list_releases(name))).next_sequence
        signed = rel.Release(name, version, sequence, platform, sha256, size)
        header = admin_pb2.PublishReleaseChunk(
            name=name,
            version=version,
            sequence=sequence,
            platform=platform,
            sha256=sha256,
            size=size,
            signature=rel.sign(signing_key, signed),
            url=url,
        )
        return await slow(c, c.publish_release(header, None if url else path))

    info = run_client(go)
    emit(
        as_json,
        info,
        f"release {info.name} {info.version} ({info.platform}) published: sequence {info.sequence}, {info.url}",
    )


def upgrade_payload(info: admin_pb2.ReleaseInfo) -> str:
    req = upgrade_request(info)
    return json_format.MessageToJson(req, indent=None)


@release.command("rollout")
@click.argument("version")
@click.option("--name", "name", default=rel.DEFAULT_NAME, show_default=True, help="The release's name.")
@click.option("--nodes", required=True, metavar="N1,N2,…", help="The nodes, in the order they are upgraded.")
@click.option("--max-unavailable", type=click.IntRange(min=1, max=10_000), default=1, show_default=True)
@click.option("--reason", default="", help="Why (kept with the job).")
@click.option("--no-wait", is_flag=True, help="Print the job id and return; do not follow it.")
@json_option
def rollout(
    version: str, name: str, nodes: str, max_unavailable: int, reason: str, no_wait: bool, as_json: bool
) -> None:
    """daemon.upgrade to VERSION on --nodes, at most --max-unavailable at once; stops on the first failure."""
    names = [n.strip() for n in nodes.split(",")]
    if any(not n for n in names):
        raise UsageError(f"--nodes must be a comma-separated list with no empty names, not {nodes!r}")

    async def go(c: AdminClient) -> admin_pb2.JobInfo:
        listed = await slow(c, c.list_releases())
        info = next((r for r in listed.releases if (r.name, r.version) == (name, version)), None)
        if info is None:
            raise NotFound(f"no release {version!r} of {name} is published (bc release status lists them)")
        if not info.platform:
            raise UsageError(
                f"release {name} {version} was signed before signatures covered its sequence and platform;"
                " nodes refuse it: publish it again (bc release publish)"
            )
        request = admin_pb2.SubmitJobRequest(
            template="release",
            nodes=names,
            reason=reason or f"release {version}",
            section="daemon",
            section_json=upgrade_payload(info),
            max_unavailable=max_unavailable,
        )
        return await submit_and_follow(c, request, wait=not no_wait)

    job = run_client(go)
    emit(as_json, lambda: job_to_json(job), job.id if no_wait else f"{job.id}  {progress_line(job)}")
    if not no_wait:
        check_done(job)


@release.command("status")
@json_option
def status(as_json: bool) -> None:
    """The published releases, the trusted release keys, and each node's latest daemon.upgrade."""
    st = run_client(lambda c: slow(c, c.list_releases()))

    def text() -> Lines:
        rows = [
            [
                cell(r.name),
                str(r.sequence),
                cell(r.version),
                cell(r.platform or "(old: publish again)"),
                r.sha256[:16] + "…",
                str(r.size),
                cell(r.url),
                format_time_ms(r.published_at_ms),
            ]
            for r in st.releases
        ]
        out: list[Lines | str] = [
            render_table(["NAME", "SEQ", "VERSION", "PLATFORM", "SHA256", "SIZE", "URL", "PUBLISHED"], rows)
            if rows
            else "no releases"
        ]
        out.append("release keys: " + (", ".join(k.key_id[:23] + "…" for k in st.keys) or "none"))
        if st.nodes:
            out.append(
                render_table(
                    ["NODE", "VERSION", "STATE", "REASON", "COMMAND"],
                    [[cell(n.node_id), cell(n.version), n.state, cell(n.reason), n.command_id] for n in st.nodes],
                )
            )
        return lines(*out)

    emit(as_json, st, text)


COMMANDS: tuple[click.Command, ...] = (release,)
