"""The seam for a hold's cgroup-v2 slice, `bc-alloc-<allocation id>.slice`: systemd on a host, files in a fake.

The devices converger asks for four things and nothing else: make (or
re-make) a slice with a hold's limits, whether it exists, whether anything
runs in it, and stop it; plus the list of hold slices this agent made, so a
slice whose hold is gone is stopped on a later pass once its workload exits.

* `SystemdSlices` (a real host): `systemctl set-property --runtime NAME
  CPUQuota=… MemoryMax=… MemoryHigh=… AllowedCPUs=… AllowedMemoryNodes=…`
  then `systemctl start NAME`; the huge page limits go to cgroupfs
  (`hugetlb.1GB.max`, with the `hugetlb` controller enabled on the slice's
  ancestors). Runtime properties live under `/run`, so a reboot drops them and
  the slice: `present` is the slice's cgroup directory. `populated` reads its
  `cgroup.events`. `stop` is `systemctl stop` then `systemctl revert` (the
  runtime drop-ins go too). `list` is the drop-in directories under
  `/run/systemd/system.control` (every slice made here has one:
  `MemoryAccounting=yes` is always set), never the cgroup tree, whose
  implicit parent slices (`bc-alloc.slice`) are not holds.
* `FakeSlices` (`--fake-hw`): one JSON file per slice under
  `<data dir>/fake-slices/`, `bc-alloc-<id>.slice.json`, recording the
  properties; its `populated` flag stands for a workload inside, which tests
  set with `FakeSlices.mark_populated`. A fake reboot removes the directory
  (agent.hw.fake), as a real reboot drops runtime properties.

Every method is async; blocking file work goes through the agent's offload.
A failure raises `SliceError` (an OSError: the converger's write-error path,
retried on the next pass).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from agent.hw.base import ProcessResult, run_process
from agent.hw.limits import SLICE_PREFIX, SLICE_SUFFIX, Limits, cgroup_path, hugetlb_limits, slice_properties
from agent.offload import Offload, to_thread
from bc.runtime.files import atomic_write

log = logging.getLogger(__name__)

FAKE_SLICES_DIR = "fake-slices"
CGROUP_ROOT = Path("/sys/fs/cgroup")
CONTROL_DIR = Path("/run/systemd/system.control")
SYSTEMCTL_TIMEOUT_S = 30.0

RunProcess = Callable[..., Awaitable[ProcessResult]]


class SliceError(OSError):
    """A slice could not be made or stopped (retryable: the next pass tries again)."""


class SliceManager(Protocol):
    async def apply(self, name: str, limits: Limits) -> None:
        """Make the slice with these limits, or set them again on the existing one."""
        ...

    async def present(self, name: str) -> bool:
        """Whether the slice exists now (a reboot drops it)."""
        ...

    async def populated(self, name: str) -> bool:
        """Whether any process runs in the slice (or below it); False when it does not exist."""
        ...

    async def stop(self, name: str) -> None:
        """Stop the slice and drop its runtime properties. The caller checks `populated` first."""
        ...

    async def list(self) -> list[str]:
        """The names of the hold slices this agent made that still exist, sorted."""
        ...


class SystemdSlices:
    """A real host's slices, through systemctl and cgroupfs (paths injectable for tests)."""

    def __init__(
        self,
        *,
        run: RunProcess = run_process,
        cgroup_root: Path = CGROUP_ROOT,
        control_dir: Path = CONTROL_DIR,
        offload: Offload = to_thread,
    ) -> None:
        self.run = run
        self.cgroup_root = cgroup_root
        self.control_dir = control_dir
        self.offload = offload

    async def _systemctl(self, *args: str) -> None:
        argv = ["systemctl", *args]
        try:
            result = await self.run(argv, timeout_s=SYSTEMCTL_TIMEOUT_S)
        except (OSError, TimeoutError) as e:
            raise SliceError(f"{' '.join(argv)}: {e}") from None
        if result.returncode != 0:
            raise SliceError(f"{' '.join(argv)} exited {result.returncode}: {result.tail(500)}")

    async def apply(self, name: str, limits: Limits) -> None:
        props = {"MemoryAccounting": "yes", **slice_properties(limits)}
        await self._systemctl("set-property", "--runtime", name, *(f"{k}={v}" for k, v in props.items()))
        await self._systemctl("start", name)
        hugetlb = hugetlb_limits(limits)
        if hugetlb:
            await self.offload(self._write_hugetlb, name, hugetlb)

    def _write_hugetlb(self, name: str, values: dict[str, int]) -> None:
        rel = cgroup_path(name).split("/")
        try:
            here = self.cgroup_root
            for part in rel[:-1]:  # the root and every ancestor hand the controller down
                _write(here / "cgroup.subtree_control", "+hugetlb")
                here = here / part
            _write(here / "cgroup.subtree_control", "+hugetlb")
            leaf = self.cgroup_root / cgroup_path(name)
            for key, value in sorted(values.items()):
                _write(leaf / key, str(value))
        except OSError as e:
            raise SliceError(f"hugetlb limits of {name}: {e}") from None

    def _cgroup_dir(self, name: str) -> Path:
        return self.cgroup_root / cgroup_path(name)

    async def present(self, name: str) -> bool:
        return await self.offload(self._cgroup_dir(name).is_dir)

    async def populated(self, name: str) -> bool:
        return await self.offload(_events_populated, self._cgroup_dir(name) / "cgroup.events")

    async def stop(self, name: str) -> None:
        await self._systemctl("stop", name)
        await self._systemctl("revert", name)

    async def list(self) -> list[str]:
        return await self.offload(_listed, self.control_dir, ".d")


class FakeSlices:
    """File-backed slices for `--fake-hw`: `<dir>/<name>.json` holds the properties and a `populated` flag."""

    def __init__(self, directory: Path, *, offload: Offload = to_thread) -> None:
        self.directory = directory
        self.offload = offload

    def path(self, name: str) -> Path:
        return self.directory / f"{name}.json"

    async def apply(self, name: str, limits: Limits) -> None:
        await self.offload(self._apply, name, limits)

    def _apply(self, name: str, limits: Limits) -> None:
        old = FakeSlices.read(self.directory, name) or {}
        doc = {
            "name": name,
            "properties": slice_properties(limits),
            "hugetlb": hugetlb_limits(limits),
            "populated": bool(old.get("populated", False)),
        }
        _atomic(self.path(name), json.dumps(doc, indent=2, sort_keys=True) + "\n")

    async def present(self, name: str) -> bool:
        return await self.offload(self.path(name).is_file)

    async def populated(self, name: str) -> bool:
        doc = await self.offload(FakeSlices.read, self.directory, name)
        return bool(doc and doc.get("populated"))

    async def stop(self, name: str) -> None:
        await self.offload(_unlink, self.path(name))

    async def list(self) -> list[str]:
        return await self.offload(_listed, self.directory, ".json")

    @staticmethod
    def read(directory: Path, name: str) -> dict[str, Any] | None:
        """The fake slice's record (`properties`, `hugetlb`, `populated`), or None when it does not exist."""
        try:
            data = json.loads((directory / f"{name}.json").read_text("utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise SliceError(f"fake slice {name}: {e}") from None
        return data if isinstance(data, dict) else None

    @staticmethod
    def mark_populated(directory: Path, name: str, populated: bool = True) -> None:
        """Tests: a workload entered (or left) the fake slice."""
        doc = FakeSlices.read(directory, name)
        if doc is None:
            raise FileNotFoundError(directory / f"{name}.json")
        doc["populated"] = populated
        _atomic(directory / f"{name}.json", json.dumps(doc, indent=2, sort_keys=True) + "\n")

    @staticmethod
    def drop_all(directory: Path) -> int:
        """A fake reboot: every fake slice is gone (runtime properties do not survive one). Returns how many."""
        n = 0
        for p in sorted(directory.glob(f"{SLICE_PREFIX}*{SLICE_SUFFIX}.json")):
            p.unlink(missing_ok=True)
            n += 1
        return n


def open_slices(touches_host: bool, data_dir: Path, *, offload: Offload = to_thread) -> SliceManager:
    """systemd on a backend that touches the host (`Capabilities.touches_host`), else fake slices under the data dir."""
    if touches_host:
        return SystemdSlices(offload=offload)
    return FakeSlices(data_dir / FAKE_SLICES_DIR, offload=offload)


# Blocking helpers (called through an offload).


def _events_populated(path: Path) -> bool:
    try:
        text = path.read_text("utf-8")
    except FileNotFoundError:
        return False
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "populated":
            return value.strip() != "0"
    return True  # no such line: assume in use rather than stop a workload


def _listed(directory: Path, suffix: str) -> list[str]:
    """The slice names with a `suffix` file in `directory` (one scandir: the drift pass asks every 10 s)."""
    end = SLICE_SUFFIX + suffix
    try:
        with os.scandir(directory) as it:
            names = [
                e.name.removesuffix(suffix)
                for e in it
                if e.name.startswith(SLICE_PREFIX) and e.name.endswith(end) and len(e.name) >= len(SLICE_PREFIX + end)
            ]
    except OSError:
        return []
    return sorted(names)


def _write(path: Path, text: str) -> None:
    with path.open("w", encoding="ascii") as f:
        f.write(text)


def _unlink(path: Path) -> None:
    path.unlink(missing_ok=True)


def _atomic(path: Path, text: str) -> None:
    atomic_write(path, text.encode())
