"""The HostOps seam: every effect of the `host` converger, files under a root and commands through a runner.

The host units (agent.converge.host_units) never touch a path or start a
process themselves. They ask `HostOps` to read, write or remove a file given
relative to the host root (`--host-root`, `/` on a real host; the fake
hardware's `<data dir>/host-root`; a temp dir in tests), and to run a
command. A relative path that climbs out of the root (`..`, an absolute path)
is refused before any I/O, so a unit can never write outside the root.

Commands go through a runner with `run_process`'s signature: the real one on
a host, `FakeRunner` under `--fake-hw` and in tests. The fake records every
argv (in memory, and as JSON lines in a file when given one, which an
end-to-end test reads), answers success, and hands `nvidia-smi` to the fake
MIG model (agent.hw.fake_mig), so a MIG layout made through the fake is what
the fake inventory shows next. Tests make a command fail with `fail_on`.

Blocking file work runs through the agent's offload; a failed command raises
`CommandFailed` (an OSError: the converger's retryable path).

The agent's other root effects sit behind seams of the same shape, each with
this direct implementation (as root, `--fake-hw`, tests) and one that asks
`bc helper` (agent.helper.node_ops, for an unprivileged `bc node`):

* `HoldFiles` here: a hold's CDI spec and env file, named by kind and allocation id;
* `agent.hw.slices.SliceManager`: a hold's slice;
* `agent.converge.sshd.SshdTools` and the access converger's file writes: sshd's files and reload;
* `HardwareBackend.reset_gpu` / `reboot` (agent.hw.base), which the `gpu.reset` and `node.reboot` kinds call.

Reads stay in the agent on every implementation: the files it reads back are
world-readable (docs/node-security.md).
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Protocol

from agent.converge import env_files, kubeadm, runtime_config
from agent.converge.gpu_packages import Package, install_argv, release_argv
from agent.hw import cdi
from agent.hw.base import HostTool, ProcessResult, run_process
from agent.offload import Offload, to_thread
from bc.protocol.host_units import Join

COMMAND_TIMEOUT_S = 120.0
PACKAGE_TIMEOUT_S = 1800.0
"""A driver install builds its kernel modules (DKMS); a join waits for the API server."""
FAKE_COMMANDS_FILE = "fake-host-commands.jsonl"
FAKE_HOST_ROOT = "host-root"

RunProcess = Callable[..., Awaitable[ProcessResult]]


class CommandFailed(OSError):
    """A host command exited non-zero, timed out or could not start (retryable)."""


class PathOutsideRoot(ValueError):
    """A unit asked for a path that is not inside the host root (a bug or bad input, never done)."""


def rel_path(rel: str) -> PurePosixPath:
    """A relative path with no `..`, no empty or `.` parts: what a unit may name under the root."""
    p = PurePosixPath(rel)
    if (
        "//" in rel
        or rel.endswith("/")
        or p.is_absolute()
        or not p.parts
        or any(part in ("..", ".", "") for part in p.parts)
        or "\0" in rel
    ):
        raise PathOutsideRoot(f"{rel!r} is not a plain relative path under the host root")
    return p


class HostOps:
    """Files under `root` and commands through `run`, every blocking call through `offload`."""

    def __init__(self, root: Path, *, run: RunProcess = run_process, offload: Offload = to_thread) -> None:
        self.root = root
        self.run = run
        self.offload = offload

    def path(self, rel: str) -> Path:
        return self.root.joinpath(*rel_path(rel).parts)

    def host_path(self, rel: str) -> str:
        """How a command names the file: its absolute path on this host (the root included)."""
        return str(self.path(rel))

    async def read(self, rel: str) -> bytes | None:
        """The file's bytes, or None when it does not exist."""
        return await self.offload(_read, self.path(rel))

    async def write(self, rel: str, data: bytes, mode: int = 0o644) -> None:
        """Whole file or nothing (temp file, fsync, rename)."""
        await self.offload(cdi.atomic_write, self.path(rel), data, mode)

    async def write_sysfs(self, rel: str, text: str) -> None:
        """Write a kernel attribute in place (sysfs files cannot be renamed over)."""
        await self.offload(_write_in_place, self.path(rel), text)

    async def remove(self, rel: str) -> bool:
        """Remove the file (durably); False when it was already gone."""
        return await self.offload(cdi.remove_file, self.path(rel))

    async def is_dir(self, rel: str) -> bool:
        return await self.offload(self.path(rel).is_dir)

    async def list_dir(self, rel: str) -> list[str]:
        """The names in a directory, sorted; empty when it does not exist."""
        return await self.offload(_list_dir, self.path(rel))

    async def command(self, *argv: str, timeout_s: float = COMMAND_TIMEOUT_S) -> ProcessResult:
        """Run a command; CommandFailed unless it exits 0."""
        try:
            result = await self.run(list(argv), timeout_s=timeout_s)
        except (OSError, TimeoutError) as e:
            raise CommandFailed(f"{' '.join(argv)}: {e or type(e).__name__}") from None
        if result.returncode != 0:
            raise CommandFailed(f"{' '.join(argv)} exited {result.returncode}: {result.tail(300)}")
        return result

    # The GPU node units' effects (agent.converge.host_units: nvidia_driver, fabric_manager, container_toolkit,
    # kubernetes), each one call so that `bc helper` (agent.helper.node_ops) can take it as one typed operation.

    async def query(self, *argv: str, timeout_s: float = COMMAND_TIMEOUT_S) -> ProcessResult:
        """A read-only command (`dpkg-query`, `rpm -q`, `systemctl is-active`): its result whatever its exit;
        CommandFailed only when it could not run."""
        try:
            return await self.run(list(argv), timeout_s=timeout_s)
        except (OSError, TimeoutError) as e:
            raise CommandFailed(f"{' '.join(argv)}: {e or type(e).__name__}") from None

    async def exists(self, rel: str) -> bool:
        return await self.offload(self.path(rel).exists)

    async def package(self, manager: str, action: str, pkg: Package) -> None:
        """`install` (and hold) the package at its version, or `release` its hold; CommandFailed when it failed."""
        for argv in install_argv(manager, pkg) if action == "install" else release_argv(manager, pkg):
            await self.command(*argv, timeout_s=PACKAGE_TIMEOUT_S)

    async def runtime_config(self, kind: str, present: bool, cdi_dir: str) -> bool:
        """Merge bc's CDI keys into (or out of) a runtime's configuration file; whether the file changed."""
        rel = runtime_config.CONFIG_FILES[kind]
        data = await self.read(rel)
        text = data.decode("utf-8", "replace") if data is not None else None
        new = runtime_config.merged(kind, text, runtime_config.cdi_dirs(cdi_dir), present)
        if new == text:
            return False
        if new is None:
            await self.remove(rel)
        else:
            await self.write(rel, new.encode())
        return True

    async def kubeadm_join(self, join: Join) -> None:
        """`kubeadm join --config` of a 0600 file that is removed whatever the join did; no message has the token."""
        try:
            await self.write(kubeadm.JOIN_CONFIG, kubeadm.render_join(join), 0o600)
            await self.command(*kubeadm.join_argv(self.host_path(kubeadm.JOIN_CONFIG)), timeout_s=PACKAGE_TIMEOUT_S)
        except OSError as e:
            raise CommandFailed(kubeadm.redact(str(e), join)) from None
        finally:
            await self.remove(kubeadm.JOIN_CONFIG)


HOLD_KINDS = ("cdi", "allocation-env")
"""What a hold writes: its CDI spec (`<cdi dir>/bc-<id>.json`) and its env file (`<env dir>/bc-<id>.env`)."""


class HoldFiles(Protocol):
    """Where a hold's two files are written and removed; the caller reads them back from the directories."""

    cdi_dir: Path
    env_dir: Path

    async def prepare(self) -> None:
        """Before a pass: the directories exist, and a crash's temp files are gone."""
        ...

    async def write(self, kind: str, allocation_id: str, data: bytes) -> None:
        """Whole file or nothing; OSError (retryable) when it could not be written."""
        ...

    async def remove(self, kind: str, allocation_id: str) -> bool:
        """Durably gone; False when it already was."""
        ...


class DirectHoldFiles:
    """The agent writes the files itself (as root, `--fake-hw`, tests)."""

    def __init__(self, cdi_dir: Path, env_dir: Path, *, offload: Offload = to_thread) -> None:
        self.cdi_dir = cdi_dir
        self.env_dir = env_dir
        self.offload = offload

    def path(self, kind: str, allocation_id: str) -> Path:
        if kind == "cdi":
            return cdi.spec_path(self.cdi_dir, allocation_id)
        return env_files.env_path(self.env_dir, allocation_id)

    async def prepare(self) -> None:
        await self.offload(_prepare_dirs, (self.cdi_dir, self.env_dir))

    async def write(self, kind: str, allocation_id: str, data: bytes) -> None:
        await self.offload(cdi.atomic_write, self.path(kind, allocation_id), data)

    async def remove(self, kind: str, allocation_id: str) -> bool:
        return await self.offload(cdi.remove_file, self.path(kind, allocation_id))


class FakeRunner:
    """Records every command; `nvidia-smi` goes to `tools['nvidia-smi']` when given; `fail_on` argv prefixes fail.

    `log_file`: where each call is appended as one JSON line (what an end-to-end test reads);
    writes go through `offload`.
    """

    def __init__(
        self,
        *,
        tools: Mapping[str, HostTool] | None = None,
        log_file: Path | None = None,
        offload: Offload = to_thread,
    ) -> None:
        self.calls: list[list[str]] = []
        self.tools = dict(tools or {})
        self.log_file = log_file
        self.offload = offload
        self.fail_on: list[tuple[str, ...]] = []

    async def __call__(self, argv: Sequence[str], *, timeout_s: float | None = None) -> ProcessResult:
        args = [str(a) for a in argv]
        self.calls.append(args)
        if self.log_file is not None:
            await self.offload(_append_line, self.log_file, json.dumps(args))
        for prefix in self.fail_on:
            if tuple(args[: len(prefix)]) == prefix:
                return ProcessResult(1, b"", f"{args[0]}: failed (fake)".encode())
        tool = self.tools.get(args[0]) if args else None
        if tool is not None:
            return await self.offload(tool, args)
        return ProcessResult(0, b"", b"")

    @staticmethod
    def read_log(log_file: Path) -> list[list[str]]:
        """The commands a fake node ran, oldest first (tests)."""
        try:
            text = log_file.read_text("utf-8")
        except FileNotFoundError:
            return []
        return [list(json.loads(line)) for line in text.splitlines() if line.strip()]


# Blocking helpers (called through an offload).


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _write_in_place(path: Path, text: str) -> None:
    with path.open("w", encoding="ascii") as f:
        f.write(text)


def _prepare_dirs(dirs: Sequence[Path]) -> None:
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
        cdi.remove_stale_temps(d)


def _list_dir(path: Path) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except (FileNotFoundError, NotADirectoryError):
        return []


def _append_line(path: Path, line: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(line + "\n")
