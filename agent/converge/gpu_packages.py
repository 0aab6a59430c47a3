"""The GPU node units' packages and commands, as argv built from validated settings. Pure, no I/O.

Shared by the units (agent.converge.host_units: the direct path, as root or
under `--fake-hw`) and by `bc helper` (agent.helper.gpu_ops), which builds
the same argv itself from the fields it validated, so an unprivileged agent
never hands root a command line.

Which package manager a host has comes from its `etc/os-release`: `ID` or
`ID_LIKE` naming debian or ubuntu is apt, one naming rhel, fedora, centos,
rocky, almalinux, ol or amzn is dnf; anything else has neither and the unit
is refused there (`UnitInvalid`).

    unit               apt package (=version-*)                   dnf package (-version)
    nvidia-driver      nvidia-driver-<branch>                     nvidia-driver (version, or <branch>.*)
    fabric-manager     nvidia-fabricmanager-<branch>              nvidia-fabric-manager
    container-toolkit  nvidia-container-toolkit                   nvidia-container-toolkit

apt installs with `--allow-change-held-packages` and then holds the package
(`apt-mark hold`), so an unattended `apt upgrade` never moves a driver under
a running workload; removing the unit unholds it. dnf has no hold without
its versionlock plugin: there a `dnf upgrade` may move the version, and the
`DriverMismatch` condition shows it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agent.hw.nvidia_host import DRIVER_MODULES as DRIVER_MODULES
from agent.hw.nvidia_host import FABRIC_MANAGER_SERVICE as FABRIC_MANAGER_SERVICE

APT, DNF = "apt", "dnf"
MANAGERS = (APT, DNF)
_APT_IDS = {"debian", "ubuntu"}
_DNF_IDS = {"rhel", "fedora", "centos", "rocky", "almalinux", "ol", "amzn"}

UNIT_PACKAGES = ("nvidia-driver", "fabric-manager", "container-toolkit")
NVIDIA_VENDOR = "0x10de"
NVSWITCH_CLASS = "0x0680"
"""A PCI bridge of NVIDIA's: an NVSwitch (the HGX baseboard's), in `sys/bus/pci/devices/*/class`."""

_VERSION = re.compile(r"[0-9]{1,4}(?:\.[0-9]{1,4}){1,3}")


def package_manager(os_release: str) -> str | None:
    """apt or dnf from an `os-release` file's ID and ID_LIKE, else None."""
    ids: set[str] = set()
    for line in os_release.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() in ("ID", "ID_LIKE"):
            ids.update(value.strip().strip("\"'").lower().split())
    if ids & _APT_IDS:
        return APT
    if ids & _DNF_IDS:
        return DNF
    return None


@dataclass(frozen=True)
class Package:
    """One unit's package: `unit` one of UNIT_PACKAGES, `branch` (drivers only) and `version` (empty: newest)."""

    unit: str
    branch: str = ""
    version: str = ""

    def __post_init__(self) -> None:
        if self.unit not in UNIT_PACKAGES:
            raise ValueError(f"no package for unit {self.unit!r}")
        if self.branch and not self.branch.isdigit():
            raise ValueError(f"branch {self.branch!r} is not a number")
        if self.version and not _VERSION.fullmatch(self.version):
            raise ValueError(f"version {self.version!r} is not dotted numbers")


def package_name(manager: str, p: Package) -> str:
    if p.unit == "nvidia-driver":
        return f"nvidia-driver-{p.branch}" if manager == APT else "nvidia-driver"
    if p.unit == "fabric-manager":
        return f"nvidia-fabricmanager-{p.branch}" if manager == APT else "nvidia-fabric-manager"
    return "nvidia-container-toolkit"


def install_argv(manager: str, p: Package) -> list[list[str]]:
    """What installs (or moves to) the package's version, then holds it where the manager can."""
    name = package_name(manager, p)
    if manager == APT:
        spec = f"{name}={p.version}-*" if p.version else name
        return [
            [
                "env",
                "DEBIAN_FRONTEND=noninteractive",
                "apt-get",
                "install",
                "-y",
                "-q",
                "--no-install-recommends",
                "--allow-downgrades",
                "--allow-change-held-packages",
                spec,
            ],
            ["apt-mark", "hold", name],
        ]
    if p.version:
        spec = f"{name}-{p.version}"
    elif p.branch:
        spec = f"{name}-{p.branch}.*"
    else:
        spec = name
    return [["dnf", "install", "-y", "-q", spec]]


def release_argv(manager: str, p: Package) -> list[list[str]]:
    """What lets the package go again when its unit leaves the spec (it stays installed)."""
    return [["apt-mark", "unhold", package_name(manager, p)]] if manager == APT else []


def query_argv(manager: str, p: Package) -> list[str]:
    """Read-only: prints the installed version (exit non-zero when it is not installed)."""
    name = package_name(manager, p)
    if manager == APT:
        return ["dpkg-query", "-W", "-f=${Version}", name]
    return ["rpm", "-q", "--qf", "%{VERSION}", name]


def upstream_version(installed: str) -> str:
    """`550.127.05-0ubuntu1` -> `550.127.05`; `3:550.127.05` -> `550.127.05` (epoch and Debian revision off)."""
    text = installed.strip().split(":", 1)[-1]
    return text.split("-", 1)[0]


def driver_reload_argv() -> list[list[str]]:
    """Unload the driver's modules and load the installed ones (fails while anything holds a GPU open)."""
    return [["modprobe", "-r", *DRIVER_MODULES], ["modprobe", "-a", *reversed(DRIVER_MODULES)]]


def fabric_manager_argv(action: str) -> list[str]:
    if action not in ("enable", "restart", "disable"):
        raise ValueError(f"no fabric manager action {action!r}")
    return ["systemctl", action, *(["--now"] if action == "disable" else []), FABRIC_MANAGER_SERVICE]


def is_nvswitch(vendor: str, pci_class: str) -> bool:
    return vendor.strip().lower() == NVIDIA_VENDOR and pci_class.strip().lower().startswith(NVSWITCH_CLASS)
