"""The fake hardware's GPU node software: packages, the loaded driver, services and a Kubernetes join.

The GPU node host units (nvidia-driver, fabric-manager, container-toolkit,
kubernetes) run programs that do not exist on this machine (NVIDIA's
packages, nvidia-container-toolkit and kubeadm are in no registry here), so
under `--fake-hw` and in tests `FakeRunner` hands their argv to this model,
which answers as the tools would and keeps what they changed:

    apt-get install … NAME[=VERSION-*]   install (the newest of a branch from CATALOG when no version); a driver
    dnf install -y … NAME[-VERSION]      of another branch replaces the installed one; an unknown branch exits 100
    apt-mark hold|unhold NAME            the holds
    dpkg-query -W -f=${Version} NAME     `<version>-0ubuntu1`, exit 1 when not installed
    rpm -q --qf %{VERSION} NAME          `<version>`, exit 1 when not installed
    modprobe -r nvidia_drm … nvidia      unloads the driver (exit 1 "in use" while Fabric Manager runs)
    modprobe -a nvidia … nvidia_drm      loads the installed driver: the inventory's `driver_version` from then on
    systemctl enable|restart|disable --now|is-active nvidia-fabricmanager.service
                                         a restart fails unless the installed Fabric Manager is the loaded driver's
    kubeadm join --config FILE           writes `kubelet.conf` beside FILE (etc/kubernetes/ under the host root),
                                         with the configuration's node-labels line (what the kubelet registers)
    kubeadm reset --force                removes it again

Every other argv (a `modprobe` of another module, `systemctl` of another
unit) succeeds and changes nothing. `boot()` is what a fake reboot does: the
installed driver loads and enabled services start. The profile's
`driver_version` is installed and loaded at first (apt's and dnf's package of
its branch). With a state dir the model persists in `fake-gpu-host.json`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent.hw.base import ProcessResult
from agent.hw.nvidia_host import DRIVER_MODULES, FABRIC_MANAGER_SERVICE
from bc.runtime.files import atomic_write

STATE_FILE = "fake-gpu-host.json"
TOOLS = ("env", "apt-get", "apt-mark", "dpkg-query", "dnf", "rpm", "modprobe", "systemctl", "kubeadm")
CATALOG = {"535": "535.183.01", "550": "550.127.05", "560": "560.35.03", "570": "570.86.15"}
"""The newest driver (and Fabric Manager) of each branch in the fake repositories."""
TOOLKIT_NEWEST = "1.17.3"
_DRIVER_APT, _FM_APT = "nvidia-driver-", "nvidia-fabricmanager-"
_DRIVER_DNF, _FM_DNF, _TOOLKIT = "nvidia-driver", "nvidia-fabric-manager", "nvidia-container-toolkit"


def _ok(out: str = "") -> ProcessResult:
    return ProcessResult(0, out.encode(), b"")


def _fail(code: int, err: str) -> ProcessResult:
    return ProcessResult(code, b"", err.encode())


class FakeGpuHost:
    def __init__(self, driver_version: str, state_dir: Path | None = None) -> None:
        self.state_path = state_dir / STATE_FILE if state_dir is not None else None
        self._lock = threading.Lock()
        self.installed: dict[str, str] = {}
        self.held: set[str] = set()
        self.enabled: set[str] = set()
        self.active: set[str] = set()
        self.loaded = driver_version
        self.kubelet_conf = ""
        if driver_version:
            branch = driver_version.split(".", 1)[0]
            self.installed = {_DRIVER_APT + branch: driver_version, _DRIVER_DNF: driver_version}
        self._load()

    # -- state -------------------------------------------------------------------------------------

    def _load(self) -> None:
        if self.state_path is None or not self.state_path.exists():
            return
        doc = json.loads(self.state_path.read_text("utf-8"))
        self.installed = {str(k): str(v) for k, v in doc["installed"].items()}
        self.held, self.enabled, self.active = set(doc["held"]), set(doc["enabled"]), set(doc["active"])
        self.loaded, self.kubelet_conf = str(doc["loaded"]), str(doc["kubelet_conf"])

    def _save(self) -> None:
        if self.state_path is None:
            return
        doc: dict[str, Any] = {
            "installed": self.installed,
            "held": sorted(self.held),
            "enabled": sorted(self.enabled),
            "active": sorted(self.active),
            "loaded": self.loaded,
            "kubelet_conf": self.kubelet_conf,
        }
        atomic_write(self.state_path, (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode())

    def installed_driver(self) -> str:
        return next((v for k, v in sorted(self.installed.items()) if k.startswith(_DRIVER_APT)), "") or (
            self.installed.get(_DRIVER_DNF, "")
        )

    def installed_fm(self) -> str:
        return next((v for k, v in sorted(self.installed.items()) if k.startswith(_FM_APT)), "") or (
            self.installed.get(_FM_DNF, "")
        )

    def boot(self) -> None:
        """A fake reboot: the installed driver loads, enabled services start (Fabric Manager if it may)."""
        with self._lock:
            self.loaded = self.installed_driver() or self.loaded
            self.active = {s for s in self.enabled if s != FABRIC_MANAGER_SERVICE or self._fm_may_start()}
            self._save()

    def _fm_may_start(self) -> bool:
        return bool(self.installed_fm()) and self.installed_fm() == self.loaded

    # -- the tools ---------------------------------------------------------------------------------

    def handle(self, argv: Sequence[str]) -> ProcessResult:
        args = list(argv)
        while args and (args[0] == "env" or "=" in args[0]):
            args.pop(0)
        if not args:
            return _ok()
        with self._lock:
            result = self._dispatch(args)
            self._save()
            return result

    def _dispatch(self, a: list[str]) -> ProcessResult:
        tool, rest = a[0], a[1:]
        if tool == "apt-get" and "install" in rest:
            return self._install([x for x in rest[rest.index("install") + 1 :] if not x.startswith("-")], apt=True)
        if tool == "dnf" and "install" in rest:
            return self._install([x for x in rest[rest.index("install") + 1 :] if not x.startswith("-")], apt=False)
        if tool == "apt-mark" and rest[:1] in (["hold"], ["unhold"]):
            for name in rest[1:]:
                (self.held.add if rest[0] == "hold" else self.held.discard)(name)
            return _ok()
        if tool in ("dpkg-query", "rpm"):
            name = rest[-1]
            if name not in self.installed:
                return _fail(1, f"{tool}: package {name} is not installed")
            return _ok(f"{self.installed[name]}-0ubuntu1" if tool == "dpkg-query" else self.installed[name])
        if tool == "modprobe":
            return self._modprobe(rest)
        if tool == "systemctl":
            return self._systemctl(rest)
        if tool == "kubeadm":
            return self._kubeadm(rest)
        return _ok()

    def _install(self, specs: list[str], *, apt: bool) -> ProcessResult:
        for spec in specs:
            name, version = self._parse_spec(spec, apt=apt)
            if name is None:
                return _fail(100, f"E: Unable to locate package {spec}")
            for other in [k for k in self.installed if k != name]:
                for prefix in (_DRIVER_APT, _FM_APT):
                    if name.startswith(prefix) and other.startswith(prefix):
                        del self.installed[other]  # one branch at a time: the new one replaces the old
            self.installed[name] = version
        return _ok()

    @staticmethod
    def _parse_spec(spec: str, *, apt: bool) -> tuple[str | None, str]:
        if apt:
            name, _, version = spec.partition("=")
            version = version.removesuffix("-*")
            if name == _TOOLKIT:
                return name, version or TOOLKIT_NEWEST
            for prefix in (_DRIVER_APT, _FM_APT):
                branch = name.removeprefix(prefix)
                if name.startswith(prefix) and branch in CATALOG:
                    return name, version or CATALOG[branch]
            return None, ""
        for name in (_FM_DNF, _TOOLKIT, _DRIVER_DNF):
            if spec == name:
                return name, TOOLKIT_NEWEST if name == _TOOLKIT else ""
            if spec.startswith(name + "-"):
                version = spec.removeprefix(name + "-")
                if version.endswith(".*"):
                    branch = version.removesuffix(".*")
                    return (name, CATALOG[branch]) if branch in CATALOG else (None, "")
                return name, version
        return None, ""

    def _modprobe(self, rest: list[str]) -> ProcessResult:
        if rest[:1] == ["-r"] and "nvidia" in rest:
            if FABRIC_MANAGER_SERVICE in self.active:
                return _fail(1, "modprobe: FATAL: Module nvidia is in use.")
            self.loaded = ""
        elif rest[:1] == ["-a"] and set(rest[1:]) == set(DRIVER_MODULES):
            self.loaded = self.installed_driver()
        return _ok()

    def _systemctl(self, rest: list[str]) -> ProcessResult:
        unit = rest[-1] if rest else ""
        if rest[:1] == ["is-active"]:
            return _ok("active\n") if unit in self.active else ProcessResult(3, b"inactive\n", b"")
        if unit != FABRIC_MANAGER_SERVICE:
            return _ok()
        if rest[0] == "enable":
            self.enabled.add(unit)
        elif rest[0] == "restart":
            if not self._fm_may_start():
                self.active.discard(unit)
                return _fail(1, f"Job for {unit} failed: the driver is not Fabric Manager's version")
            self.active.add(unit)
        elif rest[0] == "disable":
            self.enabled.discard(unit)
            self.active.discard(unit)
        return _ok()

    def _kubeadm(self, rest: list[str]) -> ProcessResult:
        if rest[:2] == ["join", "--config"] and len(rest) == 3:
            config = Path(rest[2])
            if not config.is_file() or "token:" not in config.read_text("utf-8"):
                return _fail(1, f"kubeadm: no join configuration at {config}")
            conf = config.parent / "kubelet.conf"
            # The labels the kubelet registers with (what a test reads back as the cluster's view of the node).
            labels = [ln.strip() for ln in config.read_text("utf-8").splitlines() if "node-labels:" in ln]
            conf.write_text("# fake kubelet.conf\n" + "".join(f"# {ln}\n" for ln in labels), "utf-8")
            self.kubelet_conf = str(conf)
            return _ok()
        if rest[:1] == ["reset"]:
            if self.kubelet_conf:
                Path(self.kubelet_conf).unlink(missing_ok=True)
            self.kubelet_conf = ""
            return _ok()
        return _fail(1, f"kubeadm: unknown command {' '.join(rest)[:60]}")
