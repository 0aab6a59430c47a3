"""Putting bc on a host: `bc unit print serve|node|helper` (hardened systemd units) and `bc version`.

    bc unit print serve  [--data-dir /var/lib/bc] [--listen 0.0.0.0:7443] [--advertise HOST]... [--bin PATH]
    bc unit print node   [--data-dir /var/lib/bc-node] [--cdi-dir /etc/cdi] [--env-dir /run/bc/allocations]
                         [--allow-reboot] [--allow-gpu-reset] [--upload-allow URL-PREFIX]... [--no-host-units]
                         [--user bc] [--helper-socket PATH] [--as-root] [--bin PATH]
    bc unit print helper [--user bc] [--helper-socket PATH] [--bin PATH]
    bc version [--json]

A unit is printed, never installed: the operator redirects it into
/etc/systemd/system and reads it first (see docs/install.md).

Both units run under `ProtectSystem=strict`: the whole file system is
read-only but for the directories the service writes, each named twice: as a
`StateDirectory=` / `ConfigurationDirectory=` / `RuntimeDirectory=` when it
lives under /var/lib, /etc or /run (so systemd creates it with the right
mode before the service starts), and in `ReadWritePaths=`. A directory
elsewhere must exist before the service starts.

The server needs nothing of the host but its data dir and the network, so it
gets the full sandbox and no capabilities at all. The agent, by default, runs
as its own user (`bc`) with no capabilities beside `bc helper` (root, small,
no network), which does every root effect for it (docs/node-security.md):
`bc-node.service` `Requires=` and is `After=` `bc-helper.service`. With
`--as-root` the agent is the host's GPU administrator itself (NVML on
/dev/nvidia*, `nvidia-smi --gpu-reset`, XIDs from /dev/kmsg, `systemctl
reboot`), so it runs as root with its devices, kernel logs and capabilities,
and only the protections that don't take those away.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import PurePosixPath
from typing import Any

import click

from bc.cli.emit import emit
from bc.cli.output import Lines, echo, lines, text_lines
from bc.errors import UsageError
from bc.runtime.version import bc_version, build_info

DEFAULT_BIN = "/usr/local/bin/bc"
DEFAULT_SERVE_DIR = "/var/lib/bc"
DEFAULT_NODE_DIR = "/var/lib/bc-node"
DEFAULT_CDI_DIR = "/etc/cdi"
DEFAULT_ENV_DIR = "/run/bc/allocations"
DEFAULT_USER = "bc"
DEFAULT_HELPER_SOCKET = "/run/bc-helper/helper.sock"
# What the host section's units write (docs/host.md): drop-ins, the MPS unit, bc's own host config and records.
HOST_UNIT_DIRS = ("-/etc/sysctl.d", "-/etc/modules-load.d", "-/etc/systemd/system", "/etc/bc")

# Values go into unit files unquoted: anything systemd would split, expand (`%` specifiers,
# `$` variables) or unquote is refused rather than escaped, so what the operator reads is what runs.
_SAFE = re.compile(r"[A-Za-z0-9_./:@+=,\[\]-]+")

Directive = tuple[str, str]

# Shared by both units: the protections that cost neither service anything it does.
_COMMON_HARDENING: tuple[Directive, ...] = (
    ("NoNewPrivileges", "yes"),
    ("ProtectSystem", "strict"),
    ("ProtectHome", "yes"),
    ("PrivateTmp", "yes"),
    ("ProtectControlGroups", "yes"),
    ("RestrictRealtime", "yes"),
    ("RestrictSUIDSGID", "yes"),
    ("LockPersonality", "yes"),
    ("SystemCallArchitectures", "native"),
    ("ProtectHostname", "yes"),
    ("RestrictNamespaces", "yes"),
    # AF_NETLINK: glibc's getaddrinfo asks the kernel which address families are configured;
    # AF_UNIX: journald, D-Bus (systemctl reboot), DCGM's host engine.
    ("RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6 AF_NETLINK"),
)


def _checked(value: str, what: str) -> str:
    if not _SAFE.fullmatch(value):
        raise UsageError(
            f"{what} {value!r} has characters a unit file would reinterpret; use letters, digits, ./:@+=,-"
        )
    return value


def _absolute(value: str, what: str) -> str:
    _checked(value, what)
    path = PurePosixPath(value)
    if not path.is_absolute() or ".." in path.parts:
        raise UsageError(f"{what} must be an absolute path without '..', not {value!r}")
    return str(path)


def _upload_prefix(value: str) -> str:
    """An `--upload-allow` prefix as `bc node` would take it, and safe to write unquoted."""
    from agent.kinds.upload_allow import BadUrl, parse_prefix

    try:
        parse_prefix(value)
    except BadUrl as e:
        raise UsageError(str(e)) from None
    return _checked(value, "--upload-allow")


def _writable(paths: Sequence[str], private: str) -> list[Directive]:
    """Directives that create (under /var/lib, /etc, /run) and open for writing each of `paths`.

    `private` (one of `paths`, the data dir) is created 0700 when systemd creates it.
    """
    out: list[Directive] = []
    preserve_runtime = False
    for p in paths:
        path = PurePosixPath(p)
        for base, key in (("/var/lib", "StateDirectory"), ("/etc", "ConfigurationDirectory")):
            if path.is_relative_to(base) and path != PurePosixPath(base):
                out.append((key, str(path.relative_to(base))))
        for base in ("/run", "/var/run"):
            if path.is_relative_to(base) and path != PurePosixPath(base):
                out.append(("RuntimeDirectory", str(path.relative_to(base))))
                preserve_runtime = True
    states = [PurePosixPath("/var/lib", v) for k, v in out if k == "StateDirectory"]
    if states == [PurePosixPath(private)]:
        # The mode applies to every StateDirectory: set it only when the data dir is the one.
        out.append(("StateDirectoryMode", "0700"))
    if preserve_runtime:
        # systemd deletes a RuntimeDirectory when the service stops; CDI specs and env files
        # of live reservations must outlive an agent restart.
        out.append(("RuntimeDirectoryPreserve", "yes"))
    out.append(("ReadWritePaths", " ".join(paths)))
    return out


def _render(name: str, description: str, unit: Sequence[Directive], service: Sequence[Directive]) -> Lines:
    return lines(
        f"# {name}: written by `bc unit print` (bc {bc_version()}); see docs/install.md.",
        "[Unit]",
        f"Description={description}",
        *(f"{k}={v}" for k, v in unit),
        "",
        "[Service]",
        *(f"{k}={v}" for k, v in service),
        "",
        "[Install]",
        "WantedBy=multi-user.target",
    )


def serve_unit(*, bin_path: str, data_dir: str, listen: str, advertise: Sequence[str]) -> Lines:
    """The control plane's unit: restarted when it fails, sandboxed with no capabilities."""
    argv = [bin_path, "serve", "--data-dir", data_dir, "--listen", listen]
    for host in advertise:
        argv += ["--advertise", host]
    service: list[Directive] = [
        ("Type", "exec"),
        ("ExecStart", " ".join(argv)),
        # `bc serve` also leaves the operator config in ~/.config/bc; with ProtectHome the real home
        # is out of reach, so home is the data dir, which root's admin commands search anyway.
        ("Environment", f"HOME={data_dir}"),
        ("Restart", "on-failure"),
        ("RestartSec", "5"),
        # SIGTERM to the main process only: a one-file binary's launcher relays it to bc, which
        # then stops cleanly; whatever is left after TimeoutStopSec gets SIGKILL.
        ("KillMode", "mixed"),
        ("TimeoutStopSec", "30"),
        ("UMask", "0077"),  # the CA key, the store and the operator key are nobody else's business
        *_writable([data_dir], private=data_dir),
        *_COMMON_HARDENING,
        ("PrivateDevices", "yes"),
        ("ProtectKernelTunables", "yes"),
        ("ProtectKernelModules", "yes"),
        ("ProtectKernelLogs", "yes"),
        ("ProtectClock", "yes"),
        # No MemoryDenyWriteExecute: cffi (under cryptography) builds its callbacks in writable+executable memory.
        ("SystemCallFilter", "@system-service"),
        ("SystemCallErrorNumber", "EPERM"),
        # Root without any capability: it owns its files and binds an unprivileged port, nothing more.
        ("CapabilityBoundingSet", ""),
        ("AmbientCapabilities", ""),
    ]
    unit = [("Wants", "network-online.target"), ("After", "network-online.target")]
    return _render("bc-serve.service", "bc control plane and gateway (bc serve)", unit, service)


def node_unit(
    *,
    bin_path: str,
    data_dir: str,
    cdi_dir: str,
    env_dir: str,
    allow_reboot: bool,
    allow_gpu_reset: bool,
    upload_allow: Sequence[str] = (),
    host_units: bool = True,
) -> Lines:
    """The agent's unit: always restarted, sandboxed only as far as a GPU host's administrator can be.

    With host units (the default) the agent may write what they write (`HOST_UNIT_DIRS`); without, the
    unit runs `bc node --no-host-units` and opens none of them.
    """
    argv = [bin_path, "node", "--data-dir", data_dir, "--cdi-dir", cdi_dir, "--env-dir", env_dir]
    if allow_reboot:
        argv.append("--allow-reboot")
    if allow_gpu_reset:
        argv.append("--allow-gpu-reset")
    for prefix in upload_allow:
        argv += ["--upload-allow", prefix]
    if not host_units:
        argv.append("--no-host-units")
    dirs = list(dict.fromkeys([data_dir, cdi_dir, env_dir]))
    host: list[Directive] = (
        [("ConfigurationDirectory", "bc"), ("ReadWritePaths", " ".join(HOST_UNIT_DIRS))] if host_units else []
    )
    service: list[Directive] = [
        ("Type", "exec"),
        ("ExecStart", " ".join(argv)),
        ("Environment", f"HOME={data_dir}"),
        # The agent enforces its last spec even while the control plane is away: it must always run.
        ("Restart", "always"),
        ("RestartSec", "5"),
        ("KillMode", "mixed"),
        ("TimeoutStopSec", "30"),
        # Container runtimes (rootless ones too) read the CDI specs: they must be world-readable.
        ("UMask", "0022"),
        *_writable(dirs, private=data_dir),
        *host,
        *_COMMON_HARDENING,
        # Deliberately absent, because the agent needs what they take away: PrivateDevices and ProtectClock
        # (NVML opens /dev/nvidia*; both close the device policy), ProtectKernelLogs (XIDs come from
        # /dev/kmsg), ProtectKernelModules (the driver may load its modules on first use),
        # ProtectKernelTunables (a GPU reset goes through /sys), a capability bound (reset and reboot).
    ]
    unit = [
        ("Wants", "network-online.target"),
        ("After", "network-online.target nvidia-persistenced.service"),
        # Restart=always means always: never give up after a burst of failures.
        ("StartLimitIntervalSec", "0"),
    ]
    return _render("bc-node.service", "bc node agent (bc node)", unit, service)


def unprivileged_node_unit(
    *,
    bin_path: str,
    data_dir: str,
    user: str,
    helper_socket: str,
    allow_reboot: bool,
    allow_gpu_reset: bool,
    upload_allow: Sequence[str] = (),
    host_units: bool = True,
) -> Lines:
    """The agent's default unit: its own user, no capabilities, only its data dir writable; root's work is the helper's.

    No `--cdi-dir` / `--env-dir`: the helper names its directories (`helper.hello`), and the agent reads them there.
    """
    argv = [bin_path, "node", "--data-dir", data_dir, "--helper-socket", helper_socket]
    if allow_reboot:
        argv.append("--allow-reboot")
    if allow_gpu_reset:
        argv.append("--allow-gpu-reset")
    for prefix in upload_allow:
        argv += ["--upload-allow", prefix]
    if not host_units:
        argv.append("--no-host-units")
    service: list[Directive] = [
        ("Type", "exec"),
        ("ExecStart", " ".join(argv)),
        ("User", user),
        ("Group", user),
        # NVML opens /dev/nvidia*: the driver's nodes are 0666, or 0660 group `video` where a distribution says so.
        ("SupplementaryGroups", "video"),
        ("Environment", f"HOME={data_dir}"),
        ("Restart", "always"),
        ("RestartSec", "5"),
        ("KillMode", "mixed"),
        ("TimeoutStopSec", "30"),
        ("UMask", "0077"),  # its identity, key and journal are nobody else's
        *_writable([data_dir], private=data_dir),
        *_COMMON_HARDENING,
        ("ProtectKernelModules", "yes"),
        ("ProtectKernelTunables", "yes"),  # /sys stays readable; the helper writes it
        ("ProtectKernelLogs", "yes"),  # XIDs come from the helper's stream (kmsg.follow), not /dev/kmsg
        ("SystemCallFilter", "@system-service"),
        ("SystemCallErrorNumber", "EPERM"),
        ("CapabilityBoundingSet", ""),
        ("AmbientCapabilities", ""),
        # A TPM node key is used through the helper's tpm.* operations: the agent never opens the TPM itself.
        ("InaccessiblePaths", "-/dev/tpm0 -/dev/tpmrm0"),
        # Deliberately absent: PrivateDevices and ProtectClock (NVML opens /dev/nvidia*; both close the
        # device policy).
    ]
    unit = [
        ("Requires", "bc-helper.service"),
        ("Wants", "network-online.target"),
        ("After", "bc-helper.service network-online.target nvidia-persistenced.service"),
        ("StartLimitIntervalSec", "0"),
    ]
    return _render("bc-node.service", "bc node agent, unprivileged (bc node --helper-socket)", unit, service)


def helper_unit(*, bin_path: str, user: str, helper_socket: str) -> Lines:
    """The root helper's unit: restarted 2 s after any exit, no network, the socket's directory its runtime dir."""
    socket_dir = PurePosixPath(helper_socket).parent
    if not socket_dir.is_relative_to("/run") or socket_dir == PurePosixPath("/run"):
        raise UsageError(f"--helper-socket must be in a directory under /run, not {helper_socket!r}")
    argv = [bin_path, "helper", "--socket", helper_socket, "--allow-user", user]
    service: list[Directive] = [
        ("Type", "exec"),
        ("ExecStart", " ".join(argv)),
        ("Restart", "always"),
        ("RestartSec", "2"),
        ("RuntimeDirectory", str(socket_dir.relative_to("/run"))),
        ("RuntimeDirectoryMode", "0755"),
        ("UMask", "0022"),  # CDI specs, env files and sshd's files are read by others
        # It writes /etc/cdi, /etc/sysctl.d, /sys, runs systemctl and nvidia-smi: no ProtectSystem or device
        # policy. It needs no network at all, and no home.
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("RestrictAddressFamilies", "AF_UNIX AF_NETLINK"),
        ("IPAddressDeny", "any"),
        ("LockPersonality", "yes"),
        ("RestrictRealtime", "yes"),
        ("SystemCallArchitectures", "native"),
    ]
    # The node's TPM (tpm.* operations) is the helper's: started once the kernel's TPM devices are there
    # (tpm2.target, systemd 256 and later; an older systemd ignores it). No device policy: /dev/tpmrm0, as
    # /dev/nvidia*, is open to it.
    unit = [
        ("Wants", "tpm2.target"),
        ("After", "tpm2.target"),
        ("Before", "bc-node.service"),
        ("StartLimitIntervalSec", "0"),
    ]
    return _render("bc-helper.service", "bc helper: the root side of an unprivileged bc node", unit, service)


# -- click ---------------------------------------------------------------------------


class _UnitGroup(click.Group):
    """Unknown unit names are bad input: one `error:` line and exit 2, like every other refusal."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            raise UsageError(f"unknown unit {name!r}; choose one of: {', '.join(self.list_commands(ctx))}")
        return super().resolve_command(ctx, args)


_bin_option = click.option(
    "--bin",
    "bin_path",
    default=DEFAULT_BIN,
    show_default=True,
    help="Where the bc executable lives on the host the unit runs on.",
)


@click.group("unit")
def unit() -> None:
    """Systemd units for bc serve and bc node, printed for /etc/systemd/system."""


@unit.group("print", cls=_UnitGroup)
def unit_print() -> None:
    """Print a hardened unit: `serve` (the control plane), `node` (the agent) or `helper` (the node's root helper)."""


@unit_print.command("serve")
@click.option("--data-dir", default=DEFAULT_SERVE_DIR, show_default=True, help="bc serve's data dir.")
@click.option("--listen", default="0.0.0.0:7443", show_default=True, help="HOST:PORT bc serve listens on.")
@click.option("--advertise", multiple=True, metavar="HOST", help="A name or address nodes dial (repeatable).")
@_bin_option
def print_serve(data_dir: str, listen: str, advertise: tuple[str, ...], bin_path: str) -> None:
    """The control plane's unit (bc-serve.service)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise UsageError(f"--listen must be HOST:PORT, not {listen!r}")
    echo(
        serve_unit(
            bin_path=_absolute(bin_path, "--bin"),
            data_dir=_absolute(data_dir, "--data-dir"),
            listen=_checked(listen, "--listen"),
            advertise=[_checked(a, "--advertise") for a in advertise],
        ),
    )


@unit_print.command("node")
@click.option("--data-dir", default=DEFAULT_NODE_DIR, show_default=True, help="The node's data dir (`bc join`'s).")
@click.option("--cdi-dir", default=DEFAULT_CDI_DIR, show_default=True, help="Where CDI specs go.")
@click.option("--env-dir", default=DEFAULT_ENV_DIR, show_default=True, help="Where per-reservation env files go.")
@click.option("--allow-reboot", is_flag=True, help="Let node.reboot reboot the host.")
@click.option("--allow-gpu-reset", is_flag=True, help="Let gpu.reset run nvidia-smi --gpu-reset.")
@click.option(
    "--upload-allow",
    multiple=True,
    metavar="URL-PREFIX",
    help="Let logs.collect upload under this URL prefix (repeatable; default: nowhere).",
)
@click.option("--no-host-units", is_flag=True, help="Other tooling manages this host's OS: bc node --no-host-units.")
@click.option("--user", default=DEFAULT_USER, show_default=True, help="The agent's own user (not with --as-root).")
@click.option("--helper-socket", default=DEFAULT_HELPER_SOCKET, show_default=True, help="Where bc helper listens.")
@click.option("--as-root", is_flag=True, help="The agent runs as root and does its root work itself (no helper).")
@_bin_option
def print_node(
    data_dir: str,
    cdi_dir: str,
    env_dir: str,
    allow_reboot: bool,
    allow_gpu_reset: bool,
    upload_allow: tuple[str, ...],
    no_host_units: bool,
    user: str,
    helper_socket: str,
    as_root: bool,
    bin_path: str,
) -> None:
    """The agent's unit (bc-node.service): unprivileged beside bc-helper.service, or `--as-root`."""
    _absolute(cdi_dir, "--cdi-dir")
    _absolute(env_dir, "--env-dir")
    common: dict[str, Any] = {
        "bin_path": _absolute(bin_path, "--bin"),
        "data_dir": _absolute(data_dir, "--data-dir"),
        "allow_reboot": allow_reboot,
        "allow_gpu_reset": allow_gpu_reset,
        "upload_allow": [_upload_prefix(p) for p in upload_allow],
        "host_units": not no_host_units,
    }
    if as_root:
        echo(node_unit(cdi_dir=_absolute(cdi_dir, "--cdi-dir"), env_dir=_absolute(env_dir, "--env-dir"), **common))
        return
    if (cdi_dir, env_dir) != (DEFAULT_CDI_DIR, DEFAULT_ENV_DIR):
        raise UsageError(
            "--cdi-dir and --env-dir are the helper's (under its --root); with --as-root they are the node's"
        )
    if user == "root":
        raise UsageError("--user root is --as-root: the default unit exists so that the agent is not root")
    helper_socket = _absolute(helper_socket, "--helper-socket")
    echo(unprivileged_node_unit(user=_checked(user, "--user"), helper_socket=helper_socket, **common))


@unit_print.command("helper")
@click.option("--user", default=DEFAULT_USER, show_default=True, help="The agent's user: the only peer it serves.")
@click.option("--helper-socket", default=DEFAULT_HELPER_SOCKET, show_default=True, help="Where it listens.")
@_bin_option
def print_helper(user: str, helper_socket: str, bin_path: str) -> None:
    """The node's root helper's unit (bc-helper.service)."""
    echo(
        helper_unit(
            bin_path=_absolute(bin_path, "--bin"),
            user=_checked(user, "--user"),
            helper_socket=_absolute(helper_socket, "--helper-socket"),
        )
    )


@click.command("version")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def version(as_json: bool) -> None:
    """The version, commit, build date, Python and library versions (as `bc --version`)."""
    info = build_info()
    emit(as_json, info.to_json, lambda: text_lines(info.text()))


COMMANDS: tuple[click.Command, ...] = (unit, version)
