"""What each host unit's settings may say: pure parsers both ends share.

The control plane runs them when a `host` section is written (`bc spec set`,
a rollout: `bc.protocol.spec_validation`), so settings that are bad on every
host (a sysctl key with `/` or `..`, a value with a line break, a malformed
huge page size or MIG profile name) are refused with one sentence before
anything is stored. The agent runs them again on every pass
(agent.converge.host_units), since a spec may come from an older control
plane, and then checks what only the host can say (a huge page size it
supports, a MIG profile its GPU offers). A unit name neither end knows is
not refused here: the agent answers it UNSUPPORTED.

Empty settings (`{}`, or an empty list) are valid and ask for nothing, except
`gpu-sharing`, which needs its mode, and the GPU node units (`nvidia-driver`,
`fabric-manager`, `container-toolkit`, `kubernetes`), which need what they
install or join. No message here repeats a `kubernetes` token. Each parser
takes the settings object (`settings_json`, parsed) and returns the unit's
desired value, or raises `UnitInvalid` whose message starts with the unit's
name.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bc.protocol import secret_refs


class UnitInvalid(ValueError):
    """The unit's settings are bad input (or ask what this host cannot do): terminal at this generation."""


# -- sysctl ----------------------------------------------------------------------------------------

_KEY = re.compile(r"[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*")
MAX_KEYS = 512


def parse_values(settings: Mapping[str, Any]) -> dict[str, str]:
    if len(settings) > MAX_KEYS:
        raise UnitInvalid(f"sysctl: more than {MAX_KEYS} keys")
    out: dict[str, str] = {}
    for key, value in settings.items():
        if "/" in key or ".." in key:
            raise UnitInvalid(f"sysctl: key {key!r} has a '/' or '..'; keys are dotted names")
        if not _KEY.fullmatch(key):
            raise UnitInvalid(f"sysctl: key {key!r} is not a dotted name of A-Z a-z 0-9 _ -")
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise UnitInvalid(f"sysctl: {key}'s value must be a string or an integer")
        text = str(value)
        if any(c in text for c in "\n\r\0#") or not text.strip():
            raise UnitInvalid(f"sysctl: {key}'s value is empty or has a line break, NUL or '#'")
        out[key] = text.strip()
    return dict(sorted(out.items()))


# -- kernel-modules --------------------------------------------------------------------------------

_MODULE = re.compile(r"[A-Za-z0-9_-]{1,56}")


def parse_modules(settings: Mapping[str, Any]) -> tuple[str, ...]:
    unknown = sorted(set(settings) - {"modules"})
    if unknown:
        raise UnitInvalid(f"kernel-modules: unknown setting {unknown[0]!r}; the settings are modules")
    modules = settings.get("modules", [])
    if not isinstance(modules, list):
        raise UnitInvalid("kernel-modules: modules must be a list of module names")
    seen: list[str] = []
    for m in modules:
        if not isinstance(m, str) or not _MODULE.fullmatch(m):
            raise UnitInvalid(f"kernel-modules: {m!r} is not a module name (1-56 of A-Z a-z 0-9 _ -)")
        if m in seen:
            raise UnitInvalid(f"kernel-modules: {m!r} appears twice")
        seen.append(m)
    return tuple(seen)


# -- hugepages -------------------------------------------------------------------------------------

_SIZE = re.compile(r"([1-9][0-9]{0,9})(kB|K|M|G)")
_UNITS_KB = {"kB": 1, "K": 1, "M": 1024, "G": 1024 * 1024}
MAX_COUNT = 10_000_000
MAX_NUMA_NODE = 1023

Pool = tuple[int, int | None]  # (size in kB, NUMA node or None for host-wide)


def size_kb(text: str) -> int:
    m = _SIZE.fullmatch(text)
    if not m:
        raise UnitInvalid(f"hugepages: size {text!r} is not like 2M, 1G or 2048kB")
    return int(m.group(1)) * _UNITS_KB[m.group(2)]


def parse_pools(settings: Mapping[str, Any]) -> dict[Pool, int]:
    unknown = sorted(set(settings) - {"pages"})
    if unknown:
        raise UnitInvalid(f"hugepages: unknown setting {unknown[0]!r}; the settings are pages")
    pages = settings.get("pages", [])
    if not isinstance(pages, list):
        raise UnitInvalid("hugepages: pages must be a list of {size, count, numa_node}")
    out: dict[Pool, int] = {}
    for i, p in enumerate(pages):
        if not isinstance(p, dict) or set(p) - {"size", "count", "numa_node"}:
            raise UnitInvalid(f"hugepages: pages[{i}] must be an object of size, count and numa_node")
        if not isinstance(p.get("size"), str):
            raise UnitInvalid(f"hugepages: pages[{i}].size must be a string like 2M or 1G")
        size = size_kb(p["size"])
        count = p.get("count")
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_COUNT:
            raise UnitInvalid(f"hugepages: pages[{i}].count must be an integer from 0 to {MAX_COUNT:,}")
        node = p.get("numa_node")
        if node is not None and (isinstance(node, bool) or not isinstance(node, int) or not 0 <= node <= MAX_NUMA_NODE):
            raise UnitInvalid(f"hugepages: pages[{i}].numa_node must be an integer from 0 to {MAX_NUMA_NODE}")
        if (size, node) in out:
            raise UnitInvalid(f"hugepages: pages[{i}] repeats size {p['size']} on the same node")
        out[(size, node)] = count
    sizes_global = {s for s, n in out if n is None}
    sizes_node = {s for s, n in out if n is not None}
    both = sizes_global & sizes_node
    if both:
        raise UnitInvalid(f"hugepages: {min(both)} kB pages are set both host-wide and per NUMA node")
    return dict(sorted(out.items(), key=lambda kv: (kv[0][0], -1 if kv[0][1] is None else kv[0][1])))


# -- mig -------------------------------------------------------------------------------------------

_PROFILE = re.compile(r"[1-9]g\.[0-9]{1,4}gb")
_GPU_UUID = re.compile(r"GPU-[0-9A-Za-z-]{1,64}")
MAX_INSTANCES = 7


@dataclass(frozen=True)
class GpuLayout:
    gpu: int | str  # index or UUID, as the settings say
    enabled: bool
    instances: tuple[str, ...]


def parse_layouts(settings: Mapping[str, Any]) -> tuple[GpuLayout, ...]:
    unknown = sorted(set(settings) - {"gpus"})
    if unknown:
        raise UnitInvalid(f"mig: unknown setting {unknown[0]!r}; the settings are gpus")
    gpus = settings.get("gpus", [])
    if not isinstance(gpus, list):
        raise UnitInvalid("mig: gpus must be a list of {gpu, instances}")
    out: list[GpuLayout] = []
    for i, g in enumerate(gpus):
        if not isinstance(g, dict) or set(g) - {"gpu", "instances", "enabled"}:
            raise UnitInvalid(f"mig: gpus[{i}] must be an object of gpu, instances and enabled")
        sel = g.get("gpu")
        if isinstance(sel, bool) or not (
            (isinstance(sel, int) and 0 <= sel < 64) or (isinstance(sel, str) and _GPU_UUID.fullmatch(sel))
        ):
            raise UnitInvalid(f"mig: gpus[{i}].gpu must be a GPU index or a GPU-… UUID")
        enabled = g.get("enabled", True)
        if not isinstance(enabled, bool):
            raise UnitInvalid(f"mig: gpus[{i}].enabled must be true or false")
        instances = g.get("instances", [])
        if not isinstance(instances, list) or len(instances) > MAX_INSTANCES:
            raise UnitInvalid(f"mig: gpus[{i}].instances must be a list of at most {MAX_INSTANCES} profiles")
        for p in instances:
            if not isinstance(p, str) or not _PROFILE.fullmatch(p):
                raise UnitInvalid(f"mig: gpus[{i}]: {p!r} is not a MIG profile name like 3g.40gb")
        if not enabled and instances:
            raise UnitInvalid(f"mig: gpus[{i}] turns MIG off but names instances")
        if any(o.gpu == sel for o in out):
            raise UnitInvalid(f"mig: GPU {sel} appears twice")
        out.append(GpuLayout(sel, enabled, tuple(instances)))
    return tuple(out)


# -- gpu-sharing -----------------------------------------------------------------------------------

MAX_REPLICAS = 64


@dataclass(frozen=True)
class Sharing:
    mode: str
    replicas: int = 0
    active_thread_percentage: int = 0


def parse_sharing(settings: Mapping[str, Any]) -> Sharing:
    mode = settings.get("mode")
    allowed = {"time-slicing": {"mode", "replicas"}, "mps": {"mode", "active_thread_percentage"}}
    if not isinstance(mode, str) or mode not in allowed:
        raise UnitInvalid(f"gpu-sharing: mode must be time-slicing or mps, not {mode!r}")
    unknown = sorted(set(settings) - allowed[mode])
    if unknown:
        raise UnitInvalid(f"gpu-sharing: {unknown[0]!r} is not a setting of mode {mode}")
    if mode == "time-slicing":
        replicas = settings.get("replicas")
        if isinstance(replicas, bool) or not isinstance(replicas, int) or not 2 <= replicas <= MAX_REPLICAS:
            raise UnitInvalid(f"gpu-sharing: replicas must be an integer from 2 to {MAX_REPLICAS}")
        return Sharing(mode, replicas=replicas)
    pct = settings.get("active_thread_percentage", 100)
    if isinstance(pct, bool) or not isinstance(pct, int) or not 1 <= pct <= 100:
        raise UnitInvalid("gpu-sharing: active_thread_percentage must be an integer from 1 to 100")
    return Sharing(mode, active_thread_percentage=pct)


# -- nvidia-driver, fabric-manager: a driver branch and version from the OS package manager -----------

_BRANCH = re.compile(r"[1-9][0-9]{2,3}")
_DRIVER_VERSION = re.compile(r"([1-9][0-9]{2,3})(?:\.[0-9]{1,4}){1,2}")
ACTIVATE = ("reboot", "reload")


@dataclass(frozen=True)
class Driver:
    """A driver branch (`550`) and optionally its exact version (`550.127.05`; empty: the branch's newest)."""

    branch: str
    version: str = ""
    activate: str = "reboot"
    """How a newly installed driver is loaded: a reboot (a job; see docs/host.md) or a module reload on the node."""

    def wants(self, loaded: str) -> bool:
        """Whether a loaded (or installed upstream) version is the one these settings ask for."""
        if self.version:
            return loaded == self.version
        return loaded.split(".", 1)[0] == self.branch and "." in loaded


def _branch_version(unit: str, settings: Mapping[str, Any]) -> tuple[str, str]:
    branch, version = settings.get("branch", ""), settings.get("version", "")
    if not isinstance(branch, str) or not isinstance(version, str):
        raise UnitInvalid(f'{unit}: branch and version must be strings like "550" and "550.127.05"')
    if version:
        m = _DRIVER_VERSION.fullmatch(version)
        if m is None:
            raise UnitInvalid(f"{unit}: version {version[:40]!r} is not a driver version like 550.127.05")
        if branch and branch != m.group(1):
            raise UnitInvalid(f"{unit}: version {version} is not of branch {branch[:8]}")
        branch = m.group(1)
    if not _BRANCH.fullmatch(branch):
        raise UnitInvalid(f'{unit}: branch must be a driver branch like "550" (or give a version)')
    return branch, version


def parse_driver(settings: Mapping[str, Any]) -> Driver:
    unknown = sorted(set(settings) - {"branch", "version", "activate"})
    if unknown:
        raise UnitInvalid(
            f"nvidia-driver: unknown setting {unknown[0][:40]!r}; the settings are branch, version, activate"
        )
    branch, version = _branch_version("nvidia-driver", settings)
    activate = settings.get("activate", "reboot")
    if activate not in ACTIVATE:
        raise UnitInvalid("nvidia-driver: activate must be reboot or reload")
    return Driver(branch, version, str(activate))


def parse_fabric_manager(settings: Mapping[str, Any]) -> Driver:
    unknown = sorted(set(settings) - {"branch", "version"})
    if unknown:
        raise UnitInvalid(f"fabric-manager: unknown setting {unknown[0][:40]!r}; the settings are branch and version")
    return Driver(*_branch_version("fabric-manager", settings))


# -- container-toolkit -----------------------------------------------------------------------------

RUNTIMES = ("containerd", "docker", "cri-o")
_PACKAGE_VERSION = re.compile(r"[0-9]{1,3}(?:\.[0-9]{1,4}){1,3}")


@dataclass(frozen=True)
class Toolkit:
    runtimes: tuple[str, ...]
    version: str = ""


def parse_toolkit(settings: Mapping[str, Any]) -> Toolkit:
    unknown = sorted(set(settings) - {"runtimes", "version"})
    if unknown:
        raise UnitInvalid(f"container-toolkit: unknown setting {unknown[0][:40]!r}; the settings are runtimes, version")
    runtimes = settings.get("runtimes")
    if not isinstance(runtimes, list) or not runtimes or not all(r in RUNTIMES for r in runtimes):
        raise UnitInvalid(f"container-toolkit: runtimes must be a non-empty list of {', '.join(RUNTIMES)}")
    if len(set(runtimes)) != len(runtimes):
        raise UnitInvalid("container-toolkit: a runtime appears twice")
    version = settings.get("version", "")
    if not isinstance(version, str) or (version and not _PACKAGE_VERSION.fullmatch(version)):
        raise UnitInvalid("container-toolkit: version must be a toolkit version like 1.17.3")
    return Toolkit(tuple(r for r in RUNTIMES if r in runtimes), version)


# -- kubernetes ------------------------------------------------------------------------------------

_LABEL = r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_DNS = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?)*"
_LABEL_KEY = re.compile(rf"(?:(?P<prefix>{_DNS})/)?{_LABEL}")
_LABEL_VALUE = re.compile(rf"(?:{_LABEL})?")
_ENDPOINT = re.compile(
    rf"(?:{_DNS}|[0-9]{{1,3}}(?:\.[0-9]{{1,3}}){{3}}|\[[0-9a-fA-F:.]{{2,45}}\]):(?P<port>[0-9]{{1,5}})"
)
_TOKEN = re.compile(r"[a-z0-9]{6}\.[a-z0-9]{16}")
_CA_HASH = re.compile(r"sha256:[0-9a-f]{64}")
MAX_LABELS = 64
_KUBELET_FORBIDDEN = ("kubernetes.io", "k8s.io")


@dataclass(frozen=True)
class Join:
    """A `kubeadm join` by bootstrap token: the token is a secret (never in a log, an event or a message)."""

    api_server: str
    token: str = field(repr=False)  # "" while `token_ref` names the secret that holds it
    ca_cert_hashes: tuple[str, ...]
    labels: tuple[tuple[str, str], ...] = ()
    token_ref: str = ""  # `token_secret_ref`: the secret broker's secret holding the token (docs/secrets.md)


def label_problem(key: Any, value: Any) -> str | None:
    """Why a node label cannot be set by the kubelet at join, or None."""
    if not isinstance(key, str) or len(key) > 317 or not (m := _LABEL_KEY.fullmatch(key)):
        return f"label key {str(key)[:80]!r} is not a Kubernetes label key"
    prefix = m.group("prefix") or ""
    if len(prefix) > 253:
        return f"label key {key[:80]!r} has a prefix longer than 253 characters"
    if any(prefix == p or prefix.endswith("." + p) for p in _KUBELET_FORBIDDEN):
        return f"label key {key[:80]!r} is in a namespace the kubelet may not set"
    if not isinstance(value, str) or not _LABEL_VALUE.fullmatch(value):
        return f"label {key[:80]}'s value is not a Kubernetes label value (63 of A-Z a-z 0-9 - _ .)"
    return None


def with_node_labels(join: Join, node_labels: Mapping[str, str]) -> tuple[Join, tuple[tuple[str, str], ...]]:
    """The join with bc's node labels (`bc nodes label`, as the node's signed spec carries them) added to the
    unit's own `labels`, which win on a shared key; and the bc labels left out, each with why: one the kubelet
    may not set (`label_problem`: the kubernetes.io and k8s.io namespaces, which the kubelet refuses to set on
    itself) or past `MAX_LABELS` in all. Pure: the same labels give the same join."""
    own = dict(join.labels)
    merged = dict(own)
    skipped: list[tuple[str, str]] = []
    for key, value in sorted(node_labels.items()):
        if key in own:
            continue
        problem = label_problem(key, value)
        if problem is not None:
            skipped.append((key, problem))
        elif len(merged) >= MAX_LABELS:
            skipped.append((key, f"the join already has {MAX_LABELS} labels"))
        else:
            merged[key] = value
    return dataclasses.replace(join, labels=tuple(sorted(merged.items()))), tuple(skipped)


def parse_join(settings: Mapping[str, Any]) -> Join:
    allowed = {"api_server", "token", "token_secret_ref", "ca_cert_hashes", "labels"}
    unknown = sorted(set(settings) - allowed)
    if unknown:
        raise UnitInvalid(
            f"kubernetes: unknown setting {unknown[0][:40]!r}; the settings are {', '.join(sorted(allowed))}"
        )
    server = settings.get("api_server")
    m = _ENDPOINT.fullmatch(server) if isinstance(server, str) else None
    if m is None or not 0 < int(m.group("port")) < 65536:
        raise UnitInvalid("kubernetes: api_server must be host:port (a DNS name, an IPv4 address or [IPv6])")
    token, ref = settings.get("token"), settings.get("token_secret_ref")
    if (token is None) == (ref is None):
        raise UnitInvalid("kubernetes: give the join token as token_secret_ref (a secret's name) or token, one of them")
    if ref is not None:
        if not isinstance(ref, str) or not secret_refs.NAME_RE.fullmatch(ref):
            raise UnitInvalid("kubernetes: token_secret_ref must be a secret name (1-128 of a-z 0-9 . _ -)")
        token = ""
    elif not is_bootstrap_token(token):  # never echoed: it is a secret
        raise UnitInvalid("kubernetes: token must be a bootstrap token (6 and 16 of a-z 0-9, joined by a dot)")
    hashes = settings.get("ca_cert_hashes")
    if (
        not isinstance(hashes, list)
        or not 1 <= len(hashes) <= 8
        or not all(isinstance(h, str) and _CA_HASH.fullmatch(h) for h in hashes)
    ):
        raise UnitInvalid("kubernetes: ca_cert_hashes must list 1 to 8 sha256:<64 hex> hashes of the cluster CA")
    labels = settings.get("labels", {})
    if not isinstance(labels, dict) or len(labels) > MAX_LABELS:
        raise UnitInvalid(f"kubernetes: labels must be an object of at most {MAX_LABELS} labels")
    for key, value in labels.items():
        problem = label_problem(key, value)
        if problem:
            raise UnitInvalid(f"kubernetes: {problem}")
    return Join(str(server), str(token), tuple(hashes), tuple(sorted(labels.items())), str(ref or ""))


def is_bootstrap_token(token: Any) -> bool:
    return isinstance(token, str) and _TOKEN.fullmatch(token) is not None


# -- all -------------------------------------------------------------------------------------------

PARSERS: Mapping[str, Callable[[Mapping[str, Any]], Any]] = {
    "sysctl": parse_values,
    "kernel-modules": parse_modules,
    "hugepages": parse_pools,
    "mig": parse_layouts,
    "gpu-sharing": parse_sharing,
    "nvidia-driver": parse_driver,
    "fabric-manager": parse_fabric_manager,
    "container-toolkit": parse_toolkit,
    "kubernetes": parse_join,
}


def check_settings(unit: str, settings: Mapping[str, Any]) -> None:
    """Raise UnitInvalid when a known unit's settings are bad on any host; unknown units pass."""
    parser = PARSERS.get(unit)
    if parser is not None:
        parser(settings)
