"""The long-running commands: `bc serve` (control plane), `bc join` and `bc node` (the agent).

They only turn flags into the options objects of `bc.assembly.server` and `agent.*` and
run them; those modules are imported inside each command so that `bc nodes`
does not pay for loading the control plane (and so the agent never needs the
store to be importable).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import click
from click.core import ParameterSource

from bc.cli.bounded import DAY_S, Seconds
from bc.cli.emit import emit
from bc.cli.output import echo, lines
from bc.cli.render import with_progress
from bc.errors import Unavailable, UsageError
from bc.runtime.config import default_data_dir

_DIR = click.Path(file_okay=False, path_type=Path)


@click.group("serve", invoke_without_command=True)
@click.option("--data-dir", type=_DIR, default=None, help="Where the store, CA and operator config live.")
@click.option(
    "--store",
    "store_url",
    default="",
    metavar="URL",
    help="postgresql://USER@HOST/DB (a fleet) or sqlite:PATH; default: bc.db in --data-dir.",
)
@click.option(
    "--gateway-id",
    default="",
    metavar="ID",
    help="This process's name among several bc serve on one store (default: a new one per start).",
)
@click.option(
    "--roles",
    default="api,gateway,worker",
    show_default=True,
    help="What this process serves: api (Admin, Join), gateway (node sessions), worker (the singleton loops).",
)
@click.option(
    "--listen", default="127.0.0.1:7443", show_default=True, help="HOST:PORT to listen on (api or gateway role)."
)
@click.option(
    "--advertise",
    multiple=True,
    metavar="HOST",
    help="A name or address nodes use to reach this server (repeatable; goes in its certificate).",
)
@click.option("--heartbeat-interval", type=Seconds(0, 3600, low_open=True), default=10.0, show_default=True)
@click.option("--lease-ttl", type=Seconds(0, DAY_S, low_open=True), default=40.0, show_default=True)
@click.option("--unreachable-grace", type=Seconds(0, 7 * DAY_S, low_open=True), default=120.0, show_default=True)
@click.option(
    "--command-signing",
    type=click.Choice(["on", "off"]),
    default=None,
    help="Sign commands and specs (default: on for a new install; once on, it stays on).",
)
# Hidden: a node certificate's lifetime, shortened by tests that want to see renewals (at most 24 h).
@click.option("--node-cert-ttl", type=click.IntRange(min=1, max=24 * 3600), default=24 * 3600, hidden=True)
@click.option(
    "--api",
    multiple=True,
    metavar="HOST:PORT",
    help="Where a gateway without the api role forwards Join and Renew (repeatable; default: the api processes"
    " the store lists).",
)
# Hidden: keyless gateways' serving certificates (30 days), and how long such a gateway waits for its first.
@click.option("--serving-cert-ttl", type=click.IntRange(min=60, max=3650 * 86400), default=30 * 24 * 3600, hidden=True)
@click.option("--serving-cert-wait", type=Seconds(1, DAY_S), default=120.0, hidden=True)
@click.option("--otlp-endpoint", metavar="URL", default=None, help="Export this server's metrics over OTLP there.")
@click.option(
    "--otlp-protocol",
    type=click.Choice(["grpc", "http/protobuf"]),
    default=None,
    help="OTLP's transport (default: from the port, 4318 http/protobuf, else grpc).",
)
@click.option("--otlp-interval", type=click.FloatRange(min=1, max=3600), default=60.0, show_default=True)
@click.option(
    "--release-listen",
    default="",
    metavar="HOST:PORT",
    help="Serve published releases over HTTPS here (docs/self-update.md); default: no release server.",
)
@click.option(
    "--tunnels",
    is_flag=True,
    help="Turn tunnels on: make the exec-ticket key if there is none and pin it on every node (docs/access.md).",
)
@click.pass_context
def serve(
    ctx: click.Context,
    data_dir: Path | None,
    store_url: str,
    gateway_id: str,
    roles: str,
    listen: str,
    advertise: tuple[str, ...],
    heartbeat_interval: float,
    lease_ttl: float,
    unreachable_grace: float,
    command_signing: str | None,
    node_cert_ttl: int,
    api: tuple[str, ...],
    serving_cert_ttl: int,
    serving_cert_wait: float,
    otlp_endpoint: str | None,
    otlp_protocol: str | None,
    otlp_interval: float,
    release_listen: str,
    tunnels: bool,
) -> None:
    """Run the control plane until SIGINT or SIGTERM (or `bc serve drain`)."""
    if ctx.invoked_subcommand is not None:
        return
    from bc.assembly.roles import check_flags, parse_roles
    from bc.otel.config import BadOtlpConfig, OtlpConfig, parse

    wanted = parse_roles(roles)
    # Flags this process's roles would ignore are refused before anything starts (bc.assembly.roles).
    check_flags(wanted, [name for name in ctx.params if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE])
    from bc.assembly.server import ServeOptions
    from bc.cli.serve_run import run_serve

    otlp: OtlpConfig | None = None
    if otlp_endpoint is not None:
        try:
            otlp = parse(otlp_endpoint, otlp_protocol or "", otlp_interval)
        except BadOtlpConfig as e:
            raise UsageError(str(e)) from None
    elif otlp_protocol is not None:
        raise UsageError("--otlp-protocol needs --otlp-endpoint")

    opts = ServeOptions(
        data_dir=data_dir or default_data_dir(),
        listen=listen,
        advertise=list(advertise),
        heartbeat_interval_s=heartbeat_interval,
        lease_ttl_s=lease_ttl,
        unreachable_grace_s=unreachable_grace,
        command_signing=command_signing,
        node_cert_ttl_s=node_cert_ttl,
        store=store_url,
        gateway_id=gateway_id,
        roles=wanted,
        api=list(api),
        serving_cert_ttl_s=serving_cert_ttl,
        serving_cert_wait_s=serving_cert_wait,
        otlp=otlp,
        release_listen=release_listen,
        tunnels=tunnels,
    )
    try:
        asyncio.run(run_serve(opts))
    except KeyboardInterrupt:
        pass  # run_serve shuts down cleanly on the signal; being stopped is success


@serve.command("drain")
@click.option(
    "--over",
    "over_s",
    type=click.IntRange(1, 600),
    default=60,
    show_default=True,
    help="Seconds over which this gateway's nodes are moved to the others.",
)
@click.option("--no-wait", is_flag=True, help="Return once the drain started instead of when the server exits.")
@click.option("--json", "as_json", is_flag=True)
def drain(over_s: int, no_wait: bool, as_json: bool) -> None:
    """Move the nodes of the bc serve this CLI talks to over to the other gateways, then stop it."""
    from bc.cli.connect import run_client
    from bc.client.admin import AdminClient
    from bc.errors import Unavailable

    async def go(c: AdminClient) -> dict[str, object]:
        resp = await c.drain(over_s)
        doc: dict[str, object] = {"gateway_id": resp.gateway_id, "sessions": resp.sessions, "over_s": resp.over_s}
        if no_wait:
            return {**doc, "stopped": False}
        echo_progress(f"draining {resp.sessions} sessions of {resp.gateway_id} over {resp.over_s} s ...")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + resp.over_s + 30
        while loop.time() < deadline:
            try:
                await c.server_info()
            except Unavailable:
                return {**doc, "stopped": True}
            await asyncio.sleep(0.5)
        raise Unavailable(f"{resp.gateway_id} still answers {resp.over_s + 30} s after the drain began")

    doc = run_client(go)
    verb = "drained and stopped" if doc["stopped"] else "is draining"
    emit(as_json, doc, f"{doc['gateway_id']} {verb}: {doc['sessions']} sessions moved over {doc['over_s']} s")


def echo_progress(message: str) -> None:
    echo(message, err=True)


@click.command("join")
@click.option(
    "--server",
    required=True,
    metavar="HOST:PORT[,HOST:PORT…]",
    help="The bc serve to join through; more, comma-separated, are the gateways the node may go to (docs/fleet.md).",
)
@click.option("--token", required=True, help="A token from `bc token create`.")
@click.option("--data-dir", type=_DIR, required=True, help="Where the node keeps its identity and journal.")
@click.option(
    "--reset",
    is_flag=True,
    help="Move the identity and journal already in --data-dir aside (renamed .reset-<time>) and join again.",
)
@click.option("--yes", is_flag=True, help="Confirm --reset.")
@click.option(
    "--attestor",
    type=click.Choice(["file", "tpm"]),
    default="file",
    show_default=True,
    help="Where the node key lives: a file, or inside the TPM (docs/node-security.md).",
)
@click.option("--tcti", default=None, metavar="TCTI", help="How to reach the TPM (default device:/dev/tpmrm0).")
@click.option(
    "--helper-socket",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="With --attestor tpm, as the node's user: the TPM is bc helper's, asked on this socket.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a sentence.")
def join(
    server: str,
    token: str,
    data_dir: Path,
    reset: bool,
    yes: bool,
    attestor: str,
    tcti: str | None,
    helper_socket: Path | None,
    as_json: bool,
) -> None:
    """Give this host a node identity, using a one-use join token."""
    from agent.helper.client import HelperError
    from agent.helper.node_tpm import open_tpm
    from agent.join import identity_files, join_node

    if helper_socket is not None and (attestor != "tpm" or tcti is not None):
        raise UsageError(
            "--helper-socket names where an unprivileged node's TPM is: use it with --attestor tpm, not --tcti"
        )

    if reset and not yes:
        present = ", ".join(p.name for p in identity_files(data_dir)) or "nothing (it holds no identity or journal)"
        raise UsageError(
            f"--reset would move aside in {data_dir}: {present} (renamed .reset-<time>, not deleted);"
            " stop bc node first, then add --yes"
        )
    try:
        result = asyncio.run(
            with_progress(
                join_node(
                    server=server,
                    token=token,
                    data_dir=data_dir,
                    reset=reset,
                    attestor=attestor,
                    tpm=open_tpm(helper_socket, tcti) if attestor == "tpm" else None,
                ),
                f"waiting for bc serve at {server}…",
            )
        )
    except HelperError as e:  # the helper is down, or refused its TPM operation: its sentence, retryable
        raise Unavailable(str(e)) from None
    doc = {
        "node_id": result.node_id,
        "ca_fingerprint": result.ca_fingerprint,
        "cert_not_after": result.cert_not_after,
        "data_dir": str(data_dir),
        "moved_aside": [str(p) for p in result.moved_aside],
    }
    moved = [f"moved aside: {', '.join(p.name for p in result.moved_aside)}"] if result.moved_aside else []
    emit(as_json, doc, lines(*moved, f"joined as {result.node_id}; identity stored in {data_dir}"))


@click.command("node")
@click.option("--data-dir", type=_DIR, required=True, help="The directory `bc join` wrote.")
@click.option("--fake-hw", metavar="PROFILE", default=None, help="Use seeded fake hardware (e.g. hgx-h100-8).")
@click.option("--cdi-dir", type=_DIR, default=None, help="Where CDI specs are written.")
@click.option("--env-dir", type=_DIR, default=None, help="Where per-reservation environment files go.")
@click.option(
    "--heartbeat-interval",
    type=Seconds(0, 3600, low_open=True),
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
@click.option(
    "--fake-fault",
    "fake_faults",
    multiple=True,
    metavar="KIND[:GPU]",
    help="With --fake-hw: a fault the fake shows, e.g. xid79:GPU-… or ecc:0 (repeatable; docs/health.md;"
    " more through <data-dir>/fake-faults).",
)
@click.option(
    "--host-root",
    type=_DIR,
    default=None,
    help="Where the host section's units write their files (default /; with --fake-hw, DATA_DIR/host-root).",
)
@click.option(
    "--instance-accel",
    type=click.Choice(["auto", "kvm", "tcg"]),
    default="auto",
    show_default=True,
    help="How qemu runs the instances section's VMs: auto tries KVM, then TCG (docs/instances.md).",
)
@click.option(
    "--instance-runtime",
    type=click.Choice(["auto", "fake", "qemu"]),
    default="auto",
    show_default=True,
    help="The VM runtime: auto is the fake one under --fake-hw, else qemu where it is installed; qemu runs real"
    " guests beside fake GPUs (a lab, the end-to-end tests).",
)
@click.option(
    "--libvirt-uri",
    default="qemu:///system",
    show_default=True,
    help="The libvirt connection of the libvirt runtime, used where libvirt-python is installed and it answers; "
    "empty: no libvirt runtime (docs/instances.md).",
)
@click.option(
    "--instance-stop-grace",
    type=click.FloatRange(0, 3600),
    default=60.0,
    show_default=True,
    help="Seconds a VM is given after the ACPI power button before it is ended (a guest that ignores the button"
    " waits it out).",
)
@click.option(
    "--balloon-floor",
    type=click.IntRange(10, 100),
    default=50,
    show_default=True,
    help="The least share (%) of its memory a ballooned VM is left under host memory pressure (docs/instances.md).",
)
@click.option(
    "--no-host-units",
    is_flag=True,
    help="This host's OS is managed by other tooling: answer a non-empty host section UNSUPPORTED.",
)
@click.option(
    "--ssh-dir", type=_DIR, default=None, help="Where the access section's sshd files go (default <data-dir>/ssh)."
)
@click.option(
    "--sshd-reload-cmd",
    default=None,
    metavar="CMD",
    help="Reloads sshd after its files changed (default `systemctl reload ssh`; none under --fake-hw; '' for none).",
)
@click.option(
    "--sshd-config",
    type=click.Path(path_type=Path),
    default=None,
    help="The sshd_config that includes <ssh-dir>/sshd.conf, checked with `sshd -t -f` (default /etc/ssh/sshd_config).",
)
@click.option(
    "--upgrade-confirm",
    "upgrade_confirm_s",
    type=Seconds(1, DAY_S),
    default=120.0,
    show_default=True,
    help="Seconds a self-updated binary has to get its first Welcome before it is rolled back.",
)
@click.option(
    "--download-min-bytes",
    type=click.IntRange(min=1, max=1 << 40),
    default=1 << 20,
    show_default=True,
    help="A release download moving fewer bytes than this in --download-window ends.",
)
@click.option("--download-window", "download_window_s", type=Seconds(1, DAY_S), default=120.0, show_default=True)
@click.option(
    "--helper-socket",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Run unprivileged: every root effect goes through `bc helper` on this socket (docs/node-security.md).",
)
@click.option(
    "--tcti",
    default=None,
    metavar="TCTI",
    help="How a node joined with --attestor tpm reaches its TPM (default device:/dev/tpmrm0).",
)
@click.option(
    "--site-bmc-network",
    "site_bmc_networks",
    multiple=True,
    metavar="CIDR",
    help="A site agent's BMC network: site.httpProxy never reaches an address in it (repeatable; docs/metal.md).",
)
@click.option(
    "--site-boot-dir",
    type=_DIR,
    default=None,
    help="A site agent's dnsmasq files and TFTP root; it and its parents must be readable by dnsmasq's"
    " unprivileged user (default DATA_DIR/site/boot).",
)
@click.option(
    "--site-no-dhcp",
    "site_no_dhcp",
    is_flag=True,
    help="A site agent's boot server without its DHCP half (no dnsmasq): iPXE scripts and images over HTTP"
    " only, for a network whose DHCP server chains to it (docs/metal.md).",
)
@click.option(
    "--machine-root",
    type=_DIR,
    default=None,
    help="A ramdisk's /sys, /proc and /dev are under this root (default /; with --fake-hw, DATA_DIR/machine).",
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
    fake_faults: tuple[str, ...],
    host_root: Path | None,
    instance_accel: str,
    instance_runtime: str,
    instance_stop_grace: float,
    libvirt_uri: str,
    balloon_floor: int,
    no_host_units: bool,
    ssh_dir: Path | None,
    sshd_reload_cmd: str | None,
    sshd_config: Path | None,
    upgrade_confirm_s: float,
    download_min_bytes: int,
    download_window_s: float,
    helper_socket: Path | None,
    tcti: str | None,
    site_bmc_networks: tuple[str, ...],
    site_boot_dir: Path | None,
    site_no_dhcp: bool,
    machine_root: Path | None,
) -> None:
    """Run the node agent until SIGINT or SIGTERM.

    Started through a `current` link to `bc.a` or `bc.b` (docs/self-update.md), it can update itself."""
    import sys

    from agent.app import AgentOptions, run_agent
    from agent.hw.fake_faults import BadFault, parse_faults
    from agent.kinds.upload_allow import BadUrl, parse_prefixes
    from agent.upgrade.controller import UpgradeConfig, test_pause_after
    from agent.upgrade.download import StallGuard
    from agent.upgrade.slots import install_dir_of

    try:
        parse_prefixes(upload_allow)  # refused here, before anything starts, with the sentence why
    except BadUrl as e:
        raise UsageError(str(e)) from None
    if helper_socket is not None:
        given = {"--cdi-dir": cdi_dir, "--env-dir": env_dir, "--ssh-dir": ssh_dir, "--sshd-config": sshd_config}
        mine = [flag for flag, v in {**given, "--sshd-reload-cmd": sshd_reload_cmd}.items() if v is not None]
        if mine:
            # The helper builds those paths under its own --root and runs its own reload: the node's would be ignored.
            raise UsageError(f"{', '.join(mine)} cannot be used with --helper-socket: bc helper owns those paths")
        if tcti is not None:
            raise UsageError("--tcti cannot be used with --helper-socket: the TPM is bc helper's (bc helper --tcti)")
    if fake_faults and not fake_hw:
        raise UsageError("--fake-fault needs --fake-hw: faults are injected into fake hardware only")
    try:
        parse_faults(fake_faults)
    except BadFault as e:
        raise UsageError(str(e)) from None
    import ipaddress

    from agent.site.state import SiteOptions

    try:
        bmc_networks = tuple(ipaddress.ip_network(n, strict=False) for n in site_bmc_networks)
    except ValueError as e:
        raise UsageError(f"--site-bmc-network: {e}") from None
    opts = AgentOptions(
        data_dir=data_dir,
        fake_hw=fake_hw,
        cdi_dir=cdi_dir,
        env_dir=env_dir,
        heartbeat_interval_s=heartbeat_interval,
        allow_gpu_reset=allow_gpu_reset,
        allow_reboot=allow_reboot,
        upload_allow=upload_allow,
        fake_faults=fake_faults,
        host_root=host_root,
        host_units=not no_host_units,
        instance_accel=("kvm", "tcg") if instance_accel == "auto" else (instance_accel,),
        balloon_floor_percent=balloon_floor,
        instance_runtime=instance_runtime,
        instance_stop_grace_s=instance_stop_grace,
        libvirt_uri=libvirt_uri,
        ssh_dir=ssh_dir.absolute() if ssh_dir is not None else None,
        sshd_reload_cmd=sshd_reload_cmd,
        sshd_config=sshd_config,
        install_dir=install_dir_of(sys.argv[0]),
        helper_socket=helper_socket,
        tcti=tcti,
        site=SiteOptions(bmc_networks=bmc_networks, boot_dir=site_boot_dir, run_dnsmasq=not site_no_dhcp),
        machine_root=machine_root,
        upgrade=UpgradeConfig(
            upgrade_confirm_s,
            StallGuard(download_min_bytes, download_window_s),
            pause_after=test_pause_after(fake_hw),
        ),
    )
    try:
        asyncio.run(run_agent(opts))
    except KeyboardInterrupt:
        pass  # stopped by the operator: success


COMMANDS: tuple[click.Command, ...] = (serve, join, node)
