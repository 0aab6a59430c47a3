"""Real OpenSSH through `bc tunnel`: ssh, scp and `bc exec` to a real sshd on a node that accepts no inbound port
of ours (docs/access.md).

A real `bc serve` and a real agent (fake GPUs) whose access converger writes its sshd files; an `sshd` the test
starts on the node's loopback trusts them. The operator's side is the `bc` CLI as subprocesses, exactly as in
`ssh -o ProxyCommand='bc tunnel %h PORT' user@node`: the tunnel rides the agent's own session connection, TLS
end to end to the node's certificate, and sshd authenticates a `bc ssh grant` certificate as usual.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import pty
import secrets
import shlex
import signal
import struct
import subprocess
import sys
import termios
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.app import Agent, AgentOptions
from agent.converge.sshd import find_tool
from bc.client.tunnel import TunnelClient
from bc.pki import ssh as ssh_pki
from bc.pki.secrets_source import SystemSecrets, ed25519_key
from bc.protocol.pb import admin_pb2
from bc.runtime.config import OperatorConfig
from tests.integration.conftest import InprocLab, open_lab
from tests.system_user import traversable_dir

BC = [sys.executable, "-m", "bc.cli.entry"]

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="sshd logs users in only when run as root")


@dataclass(frozen=True)
class Node:
    user: str
    sshd_port: int
    home: Path


@contextmanager
def login_user() -> Iterator[tuple[str, Path]]:
    """A system user with a shell (sshd runs its commands) and a home of its own; gone afterwards."""
    name = f"bct{secrets.token_hex(3)}"
    with traversable_dir("bc-tunnel-home-") as home:
        made = subprocess.run(
            ["useradd", "--system", "--shell", "/bin/sh", "--home-dir", str(home), "--user-group", name],
            capture_output=True,
            text=True,
        )
        if made.returncode != 0:
            pytest.skip(f"useradd refused: {made.stderr.strip()}")
        try:
            subprocess.run(["usermod", "-p", "*", name], check=True)  # no password, but not locked
            os.chown(home, int(_id("-u", name)), int(_id("-g", name)))
            yield name, home
        finally:
            subprocess.run(["userdel", name], capture_output=True)


def _id(flag: str, name: str) -> str:
    return subprocess.run(["id", flag, name], capture_output=True, text=True, check=True).stdout.strip()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def start_sshd(node_dir: Path, ssh_dir: Path, port: int) -> asyncio.subprocess.Process:
    Path("/run/sshd").mkdir(exist_ok=True)
    host_key = node_dir / "host_key"
    if not host_key.exists():
        subprocess.run([find_tool("ssh-keygen"), "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
    config = node_dir / "sshd_config"
    config.write_text(
        f"HostKey {host_key}\nListenAddress 127.0.0.1\nPort {port}\nPidFile none\nUsePAM no\nStrictModes no\n"
        f"PasswordAuthentication no\nKbdInteractiveAuthentication no\nSubsystem sftp internal-sftp\n"
        f"Include {ssh_dir / 'sshd.conf'}\n"
    )
    proc = await asyncio.create_subprocess_exec(
        find_tool("sshd"), "-D", "-e", "-f", str(config), stderr=asyncio.subprocess.PIPE
    )
    assert proc.stderr is not None
    async with asyncio.timeout(10):  # sshd says so once it listens
        while b"Server listening" not in (line := await proc.stderr.readline()):
            assert line, "sshd exited before listening"
    SSHD_LOG.clear()

    async def drain() -> None:  # read on, so sshd never blocks on a full pipe; kept for a failing test's message
        assert proc.stderr is not None
        while line := await proc.stderr.readline():
            SSHD_LOG.append(line.decode(errors="replace").rstrip())

    _drains.add(asyncio.create_task(drain()))
    return proc


SSHD_LOG: list[str] = []
_drains: set[asyncio.Task[None]] = set()


def sshd_config(node_dir: Path, ssh_dir: Path) -> Path:
    """What the access converger checks with `sshd -t -f` (the same drop-in the running sshd includes)."""
    Path("/run/sshd").mkdir(exist_ok=True)
    node_dir.mkdir(parents=True, exist_ok=True)
    host_key = node_dir / "host_key"
    subprocess.run([find_tool("ssh-keygen"), "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
    config = node_dir / "sshd_check_config"
    config.write_text(f"HostKey {host_key}\nInclude {ssh_dir / 'sshd.conf'}\n")
    return config


@dataclass
class SshLab:
    lab: InprocLab
    node: Node
    env: dict[str, str]
    key: Path


@pytest.fixture
async def sshlab(tmp_path: Path) -> AsyncIterator[SshLab]:
    # sshd reads a user's principals file as that user: the node's directories must be traversable by it.
    with login_user() as (user, home), traversable_dir("bc-tunnel-lab-") as root:
        async with open_lab(root, tunnels=True) as lab:
            await lab.admin.ssh_ca_init()
            await lab.join("n1")
            d = lab.node_dir("n1")
            ssh_dir = root / "ssh-n1"  # as /etc/ssh/bc: readable by the users sshd logs in
            ssh_dir.mkdir(mode=0o755)
            opts = AgentOptions(
                data_dir=d,
                fake_hw="hgx-h100-8",
                heartbeat_interval_s=1.0,
                sshd_config=sshd_config(d, ssh_dir),
                ssh_dir=ssh_dir,
                sshd_reload_cmd="",  # sshd reads its CA, principals and KRL files at each login
            )
            lab.agents["n1"] = agent = Agent(opts)
            lab.tasks["n1"] = asyncio.create_task(agent.run(), name="agent-n1")
            await lab.wait_connected("n1")
            await lab.wait_observed("n1", (await lab.admin.get_spec("n1")).generation)
            # The operator's key and a certificate for user@n1, as `bc ssh grant` makes it.
            key = tmp_path / "id_ed25519"
            k = ed25519_key(SystemSecrets())
            ssh_pki.write_key_file(key, k)
            g = await lab.admin.ssh_grant(
                admin_pb2.SshGrantRequest(node_id="n1", principal=user, public_key=ssh_pki.public_line(k))
            )
            (tmp_path / "id_ed25519-cert.pub").write_text(g.certificate + "\n")
            await lab.wait_observed("n1", (await lab.admin.get_spec("n1")).generation)
            port = free_port()
            sshd = await start_sshd(d, ssh_dir, port)
            assert lab.server.operator_config is not None
            env = {**os.environ, "BC_CONFIG": str(lab.server.operator_config)}
            try:
                yield SshLab(lab, Node(user, port, home), env, key)
            finally:
                sshd.terminate()
                await sshd.wait()


def ssh_argv(s: SshLab, tool: str = "ssh") -> list[str]:
    proxy = shlex.join([*BC, "tunnel", "%h", str(s.node.sshd_port)])
    return [
        find_tool(tool),
        "-i",
        str(s.key),
        "-o",
        f"CertificateFile={s.key}-cert.pub",
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        f"ProxyCommand={proxy}",
        "-o",
        "StrictHostKeyChecking=no",
        "-o",
        "UserKnownHostsFile=/dev/null",
        "-o",
        "BatchMode=yes",
        "-o",
        "LogLevel=ERROR",
    ]


async def run(argv: list[str], env: dict[str, str], timeout: float = 60) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    async with asyncio.timeout(timeout):
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_ssh_runs_a_command_through_bc_tunnel(sshlab: SshLab) -> None:
    s = sshlab
    code, out, err = await run([*ssh_argv(s), f"{s.node.user}@n1", "echo", "hello-from-$(id -un)"], s.env)
    assert code == 0, (err, SSHD_LOG)
    assert out.strip() == f"hello-from-{s.node.user}"
    ev = await s.lab.wait_event("tunnel.closed", lambda ev, d: ev.subject == "n1")
    data = json.loads(ev.data_json)
    assert data["operator"] and data["bytes_up"] > 0 and data["bytes_down"] > 0
    rows = (await s.lab.wait_event("tunnel.opened", lambda ev, d: ev.subject == "n1")).data_json
    assert json.loads(rows)["port"] == s.node.sshd_port


async def test_scp_copies_a_file_both_ways(sshlab: SshLab, tmp_path: Path) -> None:
    s = sshlab
    src = tmp_path / "payload.bin"
    src.write_bytes(os.urandom(3 * 1024 * 1024 + 17))
    target = f"{s.node.user}@n1:{s.node.home}/payload.bin"
    code, _out, err = await run([*ssh_argv(s, "scp"), "-q", str(src), target], s.env)
    assert code == 0, err
    assert (s.node.home / "payload.bin").read_bytes() == src.read_bytes()
    back = tmp_path / "back.bin"
    code, _out, err = await run([*ssh_argv(s, "scp"), "-q", target, str(back)], s.env)
    assert code == 0, err
    assert back.read_bytes() == src.read_bytes()


async def test_bc_exec_passes_the_exit_code_through_and_records_it(sshlab: SshLab) -> None:
    s = sshlab
    argv = [*BC, "exec", "n1", "--login", s.node.user, "--reason", "check the disk", "--port", str(s.node.sshd_port)]
    code, out, err = await run([*argv, "--", "sh", "-c", "echo on-$(hostname) && exit 7"], s.env)
    assert code == 7, err
    assert out.startswith("on-")
    ev = await s.lab.wait_event("tunnel.closed", lambda ev, d: ev.subject == "n1" and d.get("exit_code") == 7)
    assert json.loads(ev.data_json)["exit_code"] == 7
    issued = await s.lab.wait_event("tunnel.ticket-issued", lambda ev, d: d["purpose"] == "exec")
    assert json.loads(issued.data_json)["reason"] == "check the disk"


async def test_bc_shell_records_a_typescript_of_what_ran_on_its_own_pty(sshlab: SshLab, tmp_path: Path) -> None:
    """`bc shell` under the policy `required` (no --record: it promises by itself) on a terminal the test holds:
    ssh runs on the CLI's own pty with this terminal's window size, and the typescript holds the remote output."""
    s = sshlab
    assert s.lab.server.operator_config is not None
    async with TunnelClient(OperatorConfig.load(s.lab.server.operator_config)) as c:
        await c.record_policy(set_to="required")
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 33, 101, 0, 0))
        argv = [*BC, "shell", "n1", "--login", s.node.user, "--reason", "typescript", "--port", str(s.node.sshd_port)]
        cooked = termios.tcgetattr(slave)
        env = {**s.env, "HOME": str(tmp_path)}  # its own known_hosts: another test's sshd pinned another host key
        proc = await asyncio.create_subprocess_exec(
            *argv, env=env, stdin=slave, stdout=slave, stderr=slave, start_new_session=True
        )
        seen = bytearray()
        loop = asyncio.get_running_loop()
        first, resized = asyncio.Event(), asyncio.Event()

        def drain() -> None:  # the terminal's screen: read on until the CLI closes its end
            while True:
                try:
                    data = os.read(master, 65536)
                except OSError:
                    return
                if not data:
                    return
                seen.extend(data)
                if b"typed-42" in seen:
                    loop.call_soon_threadsafe(first.set)
                if b"44 132" in seen:
                    loop.call_soon_threadsafe(resized.set)

        screen = asyncio.create_task(asyncio.to_thread(drain))
        os.write(master, b"stty size; echo typed-$((6*7)); printf '\\033[7minverse\\n'\r")
        try:
            async with asyncio.timeout(60):
                await first.wait()
                # The operator's terminal resized: the CLI is told (SIGWINCH) and passes the new size on.
                fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 44, 132, 0, 0))
                os.kill(proc.pid, signal.SIGWINCH)
                # ssh sends the window change as a channel request of its own, which a line typed right after
                # may overtake: ask for the size until the remote pty has it (a size never passed fails below).
                for _ in range(10):
                    os.write(master, b"stty size\r")
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(1):
                            await resized.wait()
                    if resized.is_set():
                        break
                os.write(master, b"exit 3\r")
                code = await proc.wait()
                restored = termios.tcgetattr(slave)  # the CLI put this terminal in raw mode, and back
                os.close(slave)
                await screen
        finally:
            os.close(master)
        assert restored == cooked
        assert code == 3, (bytes(seen), SSHD_LOG)
        assert b"typed-42" in seen and b"33 101" in seen  # what the operator saw, window size passed through
        issued = await s.lab.wait_event("tunnel.ticket-issued", lambda ev, d: d["purpose"] == "shell")
        sid = json.loads(issued.data_json)["sid"]
        assert json.loads(issued.data_json)["record"] is True
        await s.lab.wait_event("tunnel.closed", lambda ev, d: d["sid"] == sid)
        typescript = b"".join([chunk async for chunk in c.typescript(sid)])
        assert b"typed-42" in typescript and b"33 101" in typescript and b"\x1b[7minverse" in typescript
        assert b"44 132" in seen and b"44 132" in typescript
        [row] = [r for r in await c.list("n1") if r.sid == sid]
        assert row.typescript == "complete" and row.typescript_bytes == len(typescript) and row.exit_code == 3
        # The CLI: to a file raw, to the screen escaped (no control sequence of the node's reaches a terminal).
        code, out, err = await run([*BC, "tunnels", "typescript", sid, "-o", str(tmp_path / "ts")], s.env)
        assert code == 0, err
        assert (tmp_path / "ts").read_bytes() == typescript
        code, out, err = await run([*BC, "tunnels", "typescript", sid], s.env)
        assert code == 0 and "typed-42" in out, err
        assert not any(ch in out for ch in "\r\x1b\x07") and "\\x1b[7minverse" in out, out
        code, out, err = await run([*BC, "tunnels", "record-policy", "show", "--json"], s.env)
        assert code == 0 and json.loads(out) == {"policy": "required"}, err
