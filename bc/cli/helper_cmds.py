"""`bc helper`: the root side of an unprivileged node (agent.helper; docs/node-security.md)."""

from __future__ import annotations

import asyncio
import os
import pwd
from pathlib import Path

import click

from bc.cli.output import echo
from bc.errors import UsageError

DEFAULT_SOCKET = Path("/run/bc-helper/helper.sock")


def resolve_uid(allow_uid: int | None, allow_user: str | None) -> int:
    if (allow_uid is None) == (allow_user is None):
        raise UsageError("name the node's user with exactly one of --allow-user or --allow-uid")
    if allow_uid is not None:
        return allow_uid
    try:
        return pwd.getpwnam(str(allow_user)).pw_uid
    except KeyError:
        raise UsageError(f"there is no user {allow_user!r} on this host (useradd --system {allow_user})") from None


@click.command("helper")
@click.option("--socket", "socket_path", type=click.Path(path_type=Path), default=DEFAULT_SOCKET, show_default=True)
@click.option("--allow-user", default=None, metavar="NAME", help="The node's user: the only peer served (e.g. bc).")
@click.option("--allow-uid", type=click.IntRange(min=0), default=None, help="The node's uid, instead of --allow-user.")
@click.option(
    "--root",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("/"),
    show_default=True,
    help="Where every file the helper writes lives (/etc/cdi, /run/bc/allocations, /etc/ssh/bc, ... under it).",
)
@click.option(
    "--fake-commands",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    hidden=True,
    help="Tests: record the commands as JSON lines in this file instead of running them.",
)
@click.option(
    "--node-data-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="The node's data dir (bc node --data-dir), where root reads instance records for vm.*"
    " [default: var/lib/bc-node under --root].",
)
@click.option(
    "--fake-sysfs",
    is_flag=True,
    hidden=True,
    help="Tests: the vm.* operations act on a fake sysfs tree under <root>/sys (agent.instances.fake_vfio).",
)
@click.option(
    "--instance-bridge",
    "instance_bridges",
    multiple=True,
    metavar="NAME",
    help="A bridge root may put an instance's tap on (vm.taps); repeatable. None: every tap is refused.",
)
@click.option(
    "--tcti",
    default="device:/dev/tpmrm0",
    show_default=True,
    metavar="TCTI",
    help="The TPM the node's tpm.* operations use (a node joined with --attestor tpm); swtpm:… in tests.",
)
def helper(
    socket_path: Path,
    allow_user: str | None,
    allow_uid: int | None,
    root: Path,
    fake_commands: Path | None,
    node_data_dir: Path | None,
    fake_sysfs: bool,
    instance_bridges: tuple[str, ...],
    tcti: str,
) -> None:
    """Run the root helper of an unprivileged `bc node` until SIGINT or SIGTERM.

    It serves only the node's user (checked with SO_PEERCRED on every connection) and does only the typed
    operations of its table, each checked before anything is touched."""
    from agent.converge.host_ops import FakeRunner
    from agent.helper.ops import Layout
    from agent.helper.server import serve_forever
    from agent.hw.base import run_process
    from agent.instances.fake_vfio import FakeVfio
    from agent.tpm import Tpm
    from bc.runtime import logs

    uid = resolve_uid(allow_uid, allow_user)
    if uid == 0:
        raise UsageError("the node's user must not be root: the helper exists so that the node is not")
    logs.setup("helper")
    run = FakeRunner(log_file=fake_commands) if fake_commands is not None else run_process
    if os.geteuid() != 0:
        echo("warning: bc helper is not running as root; operations will fail", err=True)
    layout = Layout(
        root.absolute(), node_data_dir.absolute() if node_data_dir is not None else None, tuple(instance_bridges)
    )
    vfio_host = FakeVfio(layout.sysfs, layout.vfio_dev) if fake_sysfs else None
    try:
        asyncio.run(serve_forever(socket_path, layout, uid, run=run, tpm=Tpm(tcti), vfio_host=vfio_host))
    except KeyboardInterrupt:
        pass


COMMANDS: tuple[click.Command, ...] = (helper,)
