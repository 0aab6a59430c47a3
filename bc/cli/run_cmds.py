"""The long-running commands: `bc serve` (control plane), `bc join` and `bc node` (the agent).

They only turn flags into the options objects of `bc.serve` and `agent.*` and
run them; those modules are imported inside each command so that `bc nodes`
does not pay for loading the control plane (and so the agent never needs the
store to be importable).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from bc.cli.emit import emit
from bc.cli.render import with_progress
from bc.config import default_data_dir
from bc.errors import UsageError

_DIR = click.Path(file_okay=False, path_type=Path)


@click.command("serve")
@click.option("--data-dir", type=_DIR, default=None, help="Where the store, CA and operator config live.")
@click.option("--listen", default="127.0.0.1:7443", show_default=True, help="HOST:PORT to listen on.")
@click.option(
    "--advertise",
    multiple=True,
    metavar="HOST",
    help="A name or address nodes use to reach this server (repeatable; goes in its certificate).",
)
@click.option("--heartbeat-interval", type=click.FloatRange(min=0, min_open=True), default=10.0, show_default=True)
@click.option("--lease-ttl", type=click.FloatRange(min=0, min_open=True), default=40.0, show_default=True)
@click.option("--unreachable-grace", type=click.FloatRange(min=0, min_open=True), default=120.0, show_default=True)
@click.option(
    "--command-signing",
    type=click.Choice(["on", "off"]),
    default=None,
    help="Sign commands and specs (default: on for a new install; once on, it stays on).",
)
# Hidden: a node certificate's lifetime, shortened by tests that want to see renewals (at most 24 h).
@click.option("--node-cert-ttl", type=click.IntRange(min=1, max=24 * 3600), default=24 * 3600, hidden=True)
def serve(
    data_dir: Path | None,
    listen: str,
    advertise: tuple[str, ...],
    heartbeat_interval: float,
    lease_ttl: float,
    unreachable_grace: float,
    command_signing: str | None,
    node_cert_ttl: int,
) -> None:
    """Run the control plane until SIGINT or SIGTERM."""
    from bc.serve import ServeOptions, run_serve

    opts = ServeOptions(
        data_dir=data_dir or default_data_dir(),
        listen=listen,
        advertise=list(advertise),
        heartbeat_interval_s=heartbeat_interval,
        lease_ttl_s=lease_ttl,
        unreachable_grace_s=unreachable_grace,
        command_signing=command_signing,
        node_cert_ttl_s=node_cert_ttl,
    )
    try:
        asyncio.run(run_serve(opts))
    except KeyboardInterrupt:
        pass  # run_serve shuts down cleanly on the signal; being stopped is success


@click.command("join")
@click.option("--server", required=True, metavar="HOST:PORT", help="The bc serve to join.")
@click.option("--token", required=True, help="A token from `bc token create`.")
@click.option("--data-dir", type=_DIR, required=True, help="Where the node keeps its identity and journal.")
@click.option(
    "--reset",
    is_flag=True,
    help="Move the identity and journal already in --data-dir aside (renamed .reset-<time>) and join again.",
)
@click.option("--yes", is_flag=True, help="Confirm --reset.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a sentence.")
def join(server: str, token: str, data_dir: Path, reset: bool, yes: bool, as_json: bool) -> None:
    """Give this host a node identity, using a one-use join token."""
    from agent.join import identity_files, join_node

    if reset and not yes:
        present = ", ".join(p.name for p in identity_files(data_dir)) or "nothing (it holds no identity or journal)"
        raise UsageError(
            f"--reset would move aside in {data_dir}: {present} (renamed .reset-<time>, not deleted);"
            " stop bc node first, then add --yes"
        )
    result = asyncio.run(
        with_progress(
            join_node(server=server, token=token, data_dir=data_dir, reset=reset),
            f"waiting for bc serve at {server}…",
        )
    )
    doc = {
        "node_id": result.node_id,
        "ca_fingerprint": result.ca_fingerprint,
        "cert_not_after": result.cert_not_after,
        "data_dir": str(data_dir),
        "moved_aside": [str(p) for p in result.moved_aside],
    }
    moved = f"moved aside: {', '.join(p.name for p in result.moved_aside)}\n" if result.moved_aside else ""
    emit(as_json, doc, f"{moved}joined as {result.node_id}; identity stored in {data_dir}")


@click.command("node")
@click.option("--data-dir", type=_DIR, required=True, help="The directory `bc join` wrote.")
@click.option("--fake-hw", metavar="PROFILE", default=None, help="Use seeded fake hardware (e.g. hgx-h100-8).")
@click.option("--cdi-dir", type=_DIR, default=None, help="Where CDI specs are written.")
@click.option("--env-dir", type=_DIR, default=None, help="Where per-reservation environment files go.")
@click.option(
    "--heartbeat-interval",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Seconds between heartbeats (default: what the server says).",
)
@click.option("--allow-gpu-reset", is_flag=True, help="Let gpu.reset run nvidia-smi --gpu-reset on real GPUs.")
@click.option("--allow-reboot", is_flag=True, help="Let node.reboot call systemctl reboot on a real host.")
@click.option(
    "--upload-allow",
    "upload_allow",
    multiple=True,
    metavar="URL-PREFIX",
    help="Let logs.collect upload under this http(s) URL prefix, e.g. https://logs.example/bc/ (repeatable;"
    " default: nowhere, the tarball stays in the data dir).",
)
def node(
    data_dir: Path,
    fake_hw: str | None,
    cdi_dir: Path | None,
    env_dir: Path | None,
    heartbeat_interval: float | None,
    allow_gpu_reset: bool,
    allow_reboot: bool,
    upload_allow: tuple[str, ...],
) -> None:
    """Run the node agent until SIGINT or SIGTERM."""
    from agent.app import AgentOptions, run_agent
    from agent.kinds.upload_allow import BadUrl, parse_prefixes

    try:
        parse_prefixes(upload_allow)  # refused here, before anything starts, with the sentence why
    except BadUrl as e:
        raise UsageError(str(e)) from None
    opts = AgentOptions(
        data_dir=data_dir,
        fake_hw=fake_hw,
        cdi_dir=cdi_dir,
        env_dir=env_dir,
        heartbeat_interval_s=heartbeat_interval,
        allow_gpu_reset=allow_gpu_reset,
        allow_reboot=allow_reboot,
        upload_allow=upload_allow,
    )
    try:
        asyncio.run(run_agent(opts))
    except KeyboardInterrupt:
        pass  # stopped by the operator: success


COMMANDS: tuple[click.Command, ...] = (serve, join, node)
