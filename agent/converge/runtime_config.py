"""The container runtimes' configuration for CDI, merged into the operator's files. Pure, no I/O.

The `container-toolkit` unit makes every runtime it names read CDI specs from
bc's CDI directory (beside the standard `/etc/cdi` and `/var/run/cdi`, so an
`nvidia-ctk cdi generate` spec still resolves), and puts the NVIDIA runtime in
CDI mode:

    runtime     file (under the host root)                     bc's keys
    containerd  etc/containerd/config.toml                     enable_cdi, cdi_spec_dirs of the CRI plugin
                                                               (config version 1, 2 or 3: each names it so)
    docker      etc/docker/daemon.json                         features.cdi, cdi-spec-dirs
    cri-o       etc/crio/crio.conf.d/99-bc-cdi.conf (bc's own) [crio.runtime] cdi_spec_dirs
    toolkit     etc/nvidia-container-runtime/config.toml       nvidia-container-runtime.mode = "cdi",
                                                               nvidia-container-runtime.modes.cdi.spec-dirs

`merged(kind, text, dirs, present)` returns the file with bc's keys set
(`present`) or taken out (the unit left the spec: the runtime's defaults
again), every other setting of the operator's kept, and `text` itself when
that changes no value (so a file is rewritten, and its runtime restarted,
only when a value of bc's changed); None means "no file"
(bc's own drop-in, or a file left with nothing but bc's keys or a
`version`). A file that does not parse is never rewritten (`ConfigUnreadable`,
retryable: the operator fixes it). TOML is written by `dumps`, which keeps
every value and table but not comments or layout; the tests parse every
result with `tomllib`.

Used by the direct HostOps and by `bc helper`, which merges as root in its
own files and takes no content from the agent.
"""

from __future__ import annotations

import datetime
import json
import math
import re
import tomllib
from collections.abc import Mapping, Sequence
from typing import Any

CONFIG_FILES: Mapping[str, str] = {
    "containerd": "etc/containerd/config.toml",
    "docker": "etc/docker/daemon.json",
    "cri-o": "etc/crio/crio.conf.d/99-bc-cdi.conf",
    "toolkit": "etc/nvidia-container-runtime/config.toml",
}
SERVICES: Mapping[str, str] = {"containerd": "containerd.service", "docker": "docker.service", "cri-o": "crio.service"}
STANDARD_CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
_CRI_PLUGIN = {
    1: ("plugins", "cri"),
    2: ("plugins", "io.containerd.grpc.v1.cri"),
    3: ("plugins", "io.containerd.cri.v1.runtime"),
}


class ConfigUnreadable(OSError):
    """A runtime's configuration file does not parse: bc leaves it alone (retried once it is fixed)."""


def cdi_dirs(bc_dir: str) -> list[str]:
    return list(dict.fromkeys([bc_dir, *STANDARD_CDI_DIRS]))


def merged(kind: str, text: str | None, dirs: Sequence[str], present: bool) -> str | None:
    if kind == "cri-o":
        return (
            f"# Written by bc (host unit container-toolkit).\n[crio.runtime]\ncdi_spec_dirs = {_value(list(dirs))}\n"
            if present
            else None
        )
    if kind == "docker":
        return _docker(text, dirs, present)
    if kind == "containerd":
        doc = before = _toml(kind, text)
        version = doc.get("version", 1 if doc else 2)
        if version not in _CRI_PLUGIN:
            raise ConfigUnreadable(f"containerd's config version {version!r} is not 1, 2 or 3; bc leaves it alone")
        if not doc and present:
            doc["version"] = 2
        keys = {"enable_cdi": True, "cdi_spec_dirs": list(dirs)}
        return _toml_result(text, before, _set(doc, _CRI_PLUGIN[version], keys, present))
    if kind == "toolkit":
        doc = before = _toml(kind, text)
        doc = _set(doc, ("nvidia-container-runtime",), {"mode": "cdi"}, present)
        doc = _set(doc, ("nvidia-container-runtime", "modes", "cdi"), {"spec-dirs": list(dirs)}, present)
        return _toml_result(text, before, doc)
    raise ValueError(f"no runtime configuration {kind!r}")


def _toml(kind: str, text: str | None) -> dict[str, Any]:
    try:
        return tomllib.loads(text or "")
    except tomllib.TOMLDecodeError as e:
        raise ConfigUnreadable(f"{CONFIG_FILES[kind]} does not parse ({e}); bc leaves it alone") from None


def _toml_result(text: str | None, before: dict[str, Any], doc: dict[str, Any]) -> str | None:
    """The file as it was when nothing changed (an operator's layout and comments stay), else `doc` written."""
    if doc == before and text is not None:
        return text
    return None if set(doc) <= {"version"} else dumps(doc)


def _docker(text: str | None, dirs: Sequence[str], present: bool) -> str | None:
    try:
        doc = json.loads(text) if text and text.strip() else {}
    except ValueError as e:
        raise ConfigUnreadable(f"etc/docker/daemon.json does not parse ({e}); bc leaves it alone") from None
    if not isinstance(doc, dict):
        raise ConfigUnreadable("etc/docker/daemon.json is not a JSON object; bc leaves it alone")
    before = doc
    doc = _set(doc, (), {"cdi-spec-dirs": list(dirs)}, present)
    doc = _set(doc, ("features",), {"cdi": True}, present)
    if doc == before and text is not None:
        return text
    return json.dumps(doc, indent=2) + "\n" if doc else None


def _set(doc: dict[str, Any], path: Sequence[str], keys: Mapping[str, Any], present: bool) -> dict[str, Any]:
    """`doc` (a copy) with `keys` set in the table at `path`, or taken out of it (and the tables they emptied)."""
    out: dict[str, Any] = _copy(doc)
    here = out
    chain: list[tuple[dict[str, Any], str]] = []
    for part in path:
        nxt = here.get(part)
        if not isinstance(nxt, dict):
            if not present:
                return out
            if nxt is not None:
                raise ConfigUnreadable(f"{'.'.join(path)} is not a table; bc leaves the file alone")
            nxt = here[part] = {}
        chain.append((here, part))
        here = nxt
    if present:
        here.update(keys)
        return out
    for k in keys:
        here.pop(k, None)
    for parent, part in reversed(chain):
        if parent[part]:
            break
        del parent[part]
    return out


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


# -- a TOML writer: every value tomllib reads, back as TOML ------------------------------------------

_BARE = re.compile(r"[A-Za-z0-9_-]+")
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _string(s: str) -> str:
    out = []
    for c in s:
        if c in _ESCAPES:
            out.append(_ESCAPES[c])
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def _key(k: str) -> str:
    return k if _BARE.fullmatch(k) else _string(k)


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, datetime.datetime | datetime.date | datetime.time):
        return v.isoformat()
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"no TOML value for {type(v).__name__}")


def _is_aot(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)


def dumps(doc: Mapping[str, Any]) -> str:
    """TOML for a document as `tomllib.loads` returns one: `tomllib.loads(dumps(d)) == d`."""
    lines: list[str] = []
    _table(lines, (), doc, header=False)
    return "\n".join(lines).lstrip("\n") + "\n"


def _table(
    lines: list[str], path: tuple[str, ...], table: Mapping[str, Any], *, header: bool, aot: bool = False
) -> None:
    plain = [(k, v) for k, v in table.items() if not isinstance(v, dict) and not _is_aot(v)]
    subs = [(k, v) for k, v in table.items() if isinstance(v, dict)]
    aots = [(k, v) for k, v in table.items() if _is_aot(v)]
    name = ".".join(map(_key, path))
    if aot:
        lines += ["", f"[[{name}]]"]
    elif header and (plain or not (subs or aots)):
        lines += ["", f"[{name}]"]
    lines += [f"{_key(k)} = {_value(v)}" for k, v in plain]
    for k, v in subs:
        _table(lines, (*path, k), v, header=True)
    for k, items in aots:
        for item in items:
            _table(lines, (*path, k), item, header=True, aot=True)
