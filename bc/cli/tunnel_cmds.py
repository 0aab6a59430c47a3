"""Tunnels to a node's loopback through its own outbound connection (docs/access.md).

    bc tunnel NODE PORT                      stdin/stdout to 127.0.0.1:PORT on NODE (ssh's ProxyCommand)
    bc port-forward NODE LOCAL:REMOTE        127.0.0.1:LOCAL here to 127.0.0.1:REMOTE on NODE, one tunnel a connection
    bc shell NODE --reason TEXT [--login U]  an interactive ssh with a short `bc ssh grant` certificate
    bc exec NODE [--login U] -- CMD...       the same, running CMD; its exit code is bc's
    bc tunnels list [--node N] [--open] [--json]
    bc tunnels close SID [--reason TEXT]     (admin) end an open tunnel
    bc tunnels rotate-key                    (admin) a new exec-ticket key: every tunnel of the old one closes
    bc tunnels record-policy show|set P      the shell typescript policy: off | optional | required (set: admin)
    bc tunnels typescript SID [-o FILE]      (admin) a recorded shell's typescript, escaped on a terminal

Each tunnel is one exec ticket (`bc.pki.exec_tickets`) the control plane issues to you for one node, one
tunnel id and one purpose, and the node checks itself; the bytes are TLS from here to the node's certificate.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import os
import shlex
import signal
import sys
import tempfile
from pathlib import Path

import click
from cryptography.hazmat.primitives import serialization

from bc.cli.emit import emit
from bc.cli.output import echo, lines
from bc.cli.pty_session import run_on_pty
from bc.cli.render import cell, format_bytes, format_time_ms, render_table
from bc.cli.tunnel_pipe import refuse_terminal, splice, stdio, stream_io
from bc.cli.typescript_upload import TypescriptUpload
from bc.client.admin import AdminClient
from bc.client.tunnel import TunnelClient
from bc.errors import BcError, UsageError
from bc.pki import ssh as ssh_pki
from bc.pki.secrets_source import SystemSecrets, ed25519_key
from bc.protocol.pb import admin_pb2, tunnel_pb2
from bc.runtime.config import find_operator_config, user_config_path

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
GRANT_TTL_S = 10 * 60
UPLOAD_WAIT_S = 30.0
"""How long `bc shell --record` waits, after ssh exits, for its typescript's last chunks to be stored."""
OBSERVE_TIMEOUT_S = 60.0


def _port(text: str, what: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise UsageError(f"the {what} {text[:32]!r} is not a port number") from None
    if not 0 <= n <= 65535:
        raise UsageError(f"the {what} {n} is not between 0 and 65535")
    return n


# -- bc tunnel --------------------------------------------------------------------------------------------


@click.command("tunnel")
@click.argument("node_id", required=False, default="")
@click.argument("port", required=False, default="")
@click.option("--purpose", default="forward", hidden=True)
@click.option("--reason", default="", help="Why (recorded with the tunnel).")
@click.option("--via", "via", default="", hidden=True, help="Relay stdin/stdout to this unix socket (bc exec).")
def tunnel(node_id: str, port: str, purpose: str, reason: str, via: str) -> None:
    """Stdin/stdout to a TCP port on NODE's loopback: ssh -o ProxyCommand='bc tunnel %h 22' USER@NODE."""
    refuse_terminal()
    if via:
        asyncio.run(_via(via))
        return
    if not node_id or not port:
        raise UsageError("bc tunnel needs a NODE and a PORT (e.g. `bc tunnel n1 22`)")
    remote = _port(port, "port")
    if remote == 0:
        raise UsageError("the port 0 is not a port on the node")

    async def go() -> None:
        async with TunnelClient(find_operator_config()) as c:
            t = await c.connect(node_id, purpose, remote, reason)
            try:
                await stdio(t)
            finally:
                await t.close()

    asyncio.run(go())


async def _via(path: str) -> None:
    """The unix socket a `bc exec` or `bc shell` holds its tunnel behind, as this process's stdin/stdout."""
    from bc.cli.tunnel_pipe import _stdin_reader, _write_stdout

    reader, writer = await asyncio.open_unix_connection(path)
    read = await _stdin_reader()

    async def up() -> None:
        while data := await read():
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()

    ups = asyncio.create_task(up())
    try:
        while data := await reader.read(65536):
            await _write_stdout(data)
    finally:
        ups.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await ups
        writer.close()


# -- bc port-forward -------------------------------------------------------------------------------------


@click.command("port-forward")
@click.argument("node_id")
@click.argument("ports")
@click.option("--reason", default="", help="Why (recorded with each tunnel).")
def port_forward(node_id: str, ports: str, reason: str) -> None:
    """Forward 127.0.0.1:LOCAL here to 127.0.0.1:REMOTE on NODE (LOCAL 0: any free port), until Ctrl-C."""
    local_s, sep, remote_s = ports.partition(":")
    if not sep:
        raise UsageError(f"the ports {ports[:32]!r} are not LOCAL:REMOTE (e.g. 9100:9100)")
    local, remote = _port(local_s, "local port"), _port(remote_s, "remote port")
    if remote == 0:
        raise UsageError("the remote port 0 is not a port on the node")
    asyncio.run(_forward(node_id, local, remote, reason))


async def _forward(node_id: str, local: int, remote: int, reason: str) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with TunnelClient(find_operator_config()) as c:
        tasks: set[asyncio.Task[None]] = set()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                t = await c.connect(node_id, "forward", remote, reason)
            except BcError as e:
                echo(f"error: {e.message}", err=True)
                writer.close()
                return
            try:
                await splice(t, *stream_io(reader, writer))
            except BcError as e:
                echo(f"error: {e.message}", err=True)
            finally:
                await t.close()

        def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.create_task(serve(reader, writer))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        server = await asyncio.start_server(accepted, "127.0.0.1", local)
        bound = int(server.sockets[0].getsockname()[1])
        echo(f"forwarding 127.0.0.1:{bound} to {node_id}:{remote} (Ctrl-C stops)", err=True)
        try:
            await stop.wait()
        finally:
            server.close()
            for t in list(tasks):
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


# -- bc shell, bc exec -----------------------------------------------------------------------------------


def _bc_command() -> list[str]:
    """How to run this very `bc` again (for ssh's ProxyCommand)."""
    if getattr(sys, "frozen", False):
        return [sys.executable]
    return [sys.executable, "-m", "bc.cli.entry"]


async def _granted(admin: AdminClient, node_id: str, login: str, public_line: str, reason: str) -> str:
    """A short certificate for `login@node_id` on the key, once the node's sshd trusts it."""
    before = await admin.get_node(node_id)
    g = await admin.ssh_grant(
        admin_pb2.SshGrantRequest(
            node_id=node_id, principal=login, public_key=public_line, ttl_s=GRANT_TTL_S, reason=reason or "bc exec"
        )
    )
    if not g.certificate:
        raise UsageError(f"the grant for {login}@{node_id} needs a quorum first (see `bc ssh grant`)")
    info = await admin.get_node(node_id)
    if info.observed_generation < info.generation:
        async with asyncio.timeout(OBSERVE_TIMEOUT_S):
            async for ev in admin.watch(after_seq=before.event_seq, type_prefix="node.observed"):
                if ev.subject == node_id and (await admin.get_node(node_id)).observed_generation >= info.generation:
                    break
    return g.certificate


async def _ssh_session(
    node_id: str,
    purpose: str,
    login: str,
    reason: str,
    command: tuple[str, ...],
    ssh_options: tuple[str, ...],
    port: int = 22,
    record: bool = False,
) -> int:
    cfg = find_operator_config()
    with tempfile.TemporaryDirectory(prefix="bc-exec-") as tmp:
        d = Path(tmp)
        key = ed25519_key(SystemSecrets())
        key_file = d / "id_ed25519"
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
        async with AdminClient(cfg) as admin:
            cert = await _granted(admin, node_id, login, ssh_pki.public_line(key), reason)
        (d / "id_ed25519-cert.pub").write_text(cert.strip() + "\n")
        known = user_config_path().parent / "known_hosts"
        known.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        sock = d / "tunnel.sock"
        async with TunnelClient(cfg) as c:
            if purpose == "shell" and not record:  # a `required` policy: the promise, kept by this very client
                record = await c.record_policy() == "required"
            ticket = await c.issue(node_id, purpose, port, reason, record=record)
            opened: list[int] = []
            tunnel_done = asyncio.Event()
            holder: dict[str, object] = {}

            async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                if opened:  # one tunnel per ticket: a second connection gets nothing
                    writer.close()
                    return
                opened.append(1)
                t = await c.open(ticket)
                holder["tunnel"] = t
                try:
                    await splice(t, *stream_io(reader, writer))
                finally:
                    tunnel_done.set()

            server = await asyncio.start_unix_server(serve, str(sock))
            proxy = shlex.join([*_bc_command(), "tunnel", "--via", str(sock)])
            argv = [
                "ssh",
                "-i",
                str(key_file),
                "-o",
                f"CertificateFile={d / 'id_ed25519-cert.pub'}",
                "-o",
                "IdentitiesOnly=yes",
                "-o",
                f"ProxyCommand={proxy}",
                # The tunnel's TLS already proved the far end is this node; its host key is pinned on first use.
                "-o",
                f"HostKeyAlias=bc-node-{node_id}",
                "-o",
                f"UserKnownHostsFile={known}",
                "-o",
                "StrictHostKeyChecking=accept-new",
                "-o",
                "BatchMode=yes",
                *ssh_options,
                f"{login}@{node_id}",
            ]
            if command:  # quoted for the remote shell, so CMD's arguments arrive as they were given here
                argv += ["--", shlex.join(command)]
            up: TypescriptUpload | None = None
            if record:
                sid = ticket.sid

                async def send(offset: int, data: bytes, done: bool) -> int:
                    return await c.upload_typescript(sid, offset, data, done)

                up = TypescriptUpload(send)
                uploading = asyncio.create_task(up.run(), name=f"typescript-{sid}")
                code = await run_on_pty(argv, up.feed)
            else:
                proc = await asyncio.create_subprocess_exec(*argv)
                code = await proc.wait()
            if code < 0:  # ended by a signal: a shell's way of saying so
                code = 128 - code
            server.close()
            t = holder.get("tunnel")
            if t is not None:
                from bc.client.tunnel import OpenTunnel

                assert isinstance(t, OpenTunnel)
                await t.close(exit_code=code)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(2):
                        await tunnel_done.wait()
            if up is not None:
                up.close()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(UPLOAD_WAIT_S):
                        await uploading
                _say_typescript(ticket.sid, up)
            return code


def _say_typescript(sid: str, up: TypescriptUpload) -> None:
    if up.error is not None:
        echo(f"warning: the typescript of {sid} was not stored whole: {up.error.message}", err=True)
    elif up.dropped:
        echo(f"warning: the typescript of {sid} was cut at {up.limit} bytes ({up.dropped} not stored)", err=True)
    elif not uploaded_all(up):
        echo(f"warning: the typescript of {sid} was still uploading after {UPLOAD_WAIT_S:.0f} s", err=True)


def uploaded_all(up: TypescriptUpload) -> bool:
    return up.sent == up.fed and not up.pending


def _login(login: str) -> str:
    return login or os.environ.get("USER") or getpass.getuser()


@click.command("shell")
@click.argument("node_id")
@click.option("--reason", required=True, help="Why you need a shell on the node (recorded; required).")
@click.option("--login", default="", help="The node's local user (default: yours here).")
@click.option("-o", "ssh_options", multiple=True, help="An extra ssh option (-o Key=Value), repeatable.", hidden=True)
@click.option("--port", default=22, show_default=True, help="sshd's port on the node's loopback.")
@click.option(
    "--record", is_flag=True, help="Keep a typescript of the session on the control plane (implied by policy)."
)
def shell(node_id: str, reason: str, login: str, ssh_options: tuple[str, ...], port: int, record: bool) -> None:
    """An interactive shell on NODE: a 10-minute certificate for you, ssh through a tunnel."""
    if not reason.strip():
        raise UsageError("a shell needs a reason: pass --reason TEXT (it is recorded with the session)")
    opts = tuple(x for o in ssh_options for x in ("-o", o))
    sys.exit(asyncio.run(_ssh_session(node_id, "shell", _login(login), reason, (), opts, port, record)))


@click.command("exec", context_settings={"ignore_unknown_options": True})
@click.argument("node_id")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.option("--login", default="", help="The node's local user (default: yours here).")
@click.option("--reason", default="", help="Why (recorded with the session).")
@click.option("-o", "ssh_options", multiple=True, help="An extra ssh option (-o Key=Value), repeatable.", hidden=True)
@click.option("--port", default=22, show_default=True, help="sshd's port on the node's loopback.")
def exec_(
    node_id: str, command: tuple[str, ...], login: str, reason: str, ssh_options: tuple[str, ...], port: int
) -> None:
    """Run CMD on NODE over ssh through a tunnel (bc exec NODE -- CMD ARGS); exits with CMD's exit code."""
    opts = tuple(x for o in ssh_options for x in ("-o", o))
    sys.exit(asyncio.run(_ssh_session(node_id, "exec", _login(login), reason, command, opts, port)))


# -- bc tunnels -------------------------------------------------------------------------------------------


@click.group("tunnels")
def tunnels() -> None:
    """The tunnels opened through the control plane: who, which node, when, how many bytes."""


def _duration(r: tunnel_pb2.TunnelRecord) -> str:
    if not r.opened_at_ms:
        return "-"
    end = r.ended_at_ms or 0
    return f"{(end - r.opened_at_ms) / 1000:.1f}s" if end else "open"


@tunnels.command("list")
@click.option("--node", "node_id", default="", help="Only this node's tunnels.")
@click.option("--open", "open_only", is_flag=True, help="Only the open ones.")
@click.option("--limit", default=200, show_default=True, help="At most this many, newest first.")
@json_option
def list_(node_id: str, open_only: bool, limit: int, as_json: bool) -> None:
    """Every tunnel: its id, node, operator, purpose, state, start, bytes each way, exit code, why."""

    async def go() -> list[tunnel_pb2.TunnelRecord]:
        async with TunnelClient(find_operator_config()) as c:
            return await c.list(node_id, open_only, limit)

    rows_in = asyncio.run(go())
    rows = [
        (
            r.sid,
            r.node_id,
            r.operator,
            f"{r.purpose}:{r.port}",
            r.state,
            format_time_ms(r.opened_at_ms or r.issued_at_ms),
            _duration(r),
            format_bytes(r.bytes_up),
            format_bytes(r.bytes_down),
            r.exit_code if r.has_exit_code else "-",
            r.typescript or "-",
            cell(r.reason or r.end_reason or "-", width=40),
        )
        for r in rows_in
    ]
    headers = (
        "SID",
        "NODE",
        "OPERATOR",
        "PURPOSE",
        "STATE",
        "STARTED",
        "LASTED",
        "UP",
        "DOWN",
        "EXIT",
        "TYPESCRIPT",
        "WHY",
    )
    emit(as_json, rows_in, lambda: render_table(headers, rows), empty="no tunnels")


@tunnels.command("close")
@click.argument("sid")
@click.option("--reason", default="", help="Why (recorded).")
@json_option
def close(sid: str, reason: str, as_json: bool) -> None:
    """End an open tunnel now (admin)."""

    async def go() -> tunnel_pb2.TunnelRecord:
        async with TunnelClient(find_operator_config()) as c:
            return await c.close_tunnel(sid, reason)

    r = asyncio.run(go())
    emit(as_json, r, f"tunnel {r.sid} to {r.node_id} is {r.state}")


@tunnels.command("rotate-key")
@json_option
def rotate_key(as_json: bool) -> None:
    """A new exec-ticket key, pinned on every node; every tunnel opened under the old one closes (admin)."""

    async def go() -> tunnel_pb2.TicketKeyInfo:
        async with TunnelClient(find_operator_config()) as c:
            return await c.rotate_key()

    info = asyncio.run(go())
    emit(as_json, info, f"exec-ticket key {info.kid} pinned; {info.nodes_changed} node specs changed")


@tunnels.group("record-policy")
def record_policy() -> None:
    """Whether shells are recorded: off, optional (`bc shell --record`) or required (every shell)."""


@record_policy.command("show")
@json_option
def record_policy_show(as_json: bool) -> None:
    """The policy now."""

    async def go() -> str:
        async with TunnelClient(find_operator_config()) as c:
            return await c.record_policy()

    p = asyncio.run(go())
    emit(as_json, {"policy": p}, f"record policy: {p}")


@record_policy.command("set")
@click.argument("policy", type=click.Choice(["off", "optional", "required"]))
@json_option
def record_policy_set(policy: str, as_json: bool) -> None:
    """Set the policy (admin); an event records the change."""

    async def go() -> str:
        async with TunnelClient(find_operator_config()) as c:
            return await c.record_policy(set_to=policy)

    p = asyncio.run(go())
    emit(as_json, {"policy": p}, f"record policy: {p}")


@tunnels.command("typescript")
@click.argument("sid")
@click.option("-o", "--output", "output", default="", help="Write the raw bytes to this file (0600).")
def typescript(sid: str, output: str) -> None:
    """A recorded shell's typescript (admin): raw into a file with -o, else escaped, never raw to a terminal."""

    async def go() -> bytes:
        got = bytearray()
        async with TunnelClient(find_operator_config()) as c:
            async for chunk in c.typescript(sid):
                got += chunk
        return bytes(got)

    data = asyncio.run(go())
    if output:
        fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        echo(f"{len(data)} bytes of {sid}'s typescript written to {output}", err=True)
        return
    echo(lines(data.decode("utf-8", errors="replace").replace("\r\n", "\n").split("\n")))


COMMANDS: tuple[click.Command, ...] = (tunnel, port_forward, shell, exec_, tunnels)
