"""BMC credentials: a 0600 JSON file on the site host (the `site` section's `credentials_file`), or the same
JSON as a secret of the broker (`credentials_secret_ref`, delivered into memory: `parse` and `pick`).

A spec or a command never carries one (docs/metal.md). The document:

    {"default": {"username": "admin", "password": "..."},
     "machines": {"rack1-n01": {"username": "root", "password": "..."}}}

It is refused, and no BMC is driven with it, when anyone but its owner may read or write it (mode & 0o077),
when it is not a regular file, or when it is not that shape. `bmc.rotate` replaces one machine's password in
three writes (`stage`, then the BMC, then `commit`, or `unstage` when the BMC refused): the new password is
on disk as the machine's `pending` entry before the BMC is asked to take it, so no crash or failed write
loses access. Each write is a new file beside the old one, 0600, fsynced and renamed over it.
Blocking: the caller runs these through its offload.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class CredentialsError(Exception):
    """The credentials file cannot be used; the message is one sentence an operator can act on."""


@dataclass(frozen=True)
class Credential:
    username: str
    password: str

    def __repr__(self) -> str:  # never in a log line
        return f"Credential(username={self.username!r}, password=<redacted>)"


def _entry(doc: Any, where: str) -> Credential:
    if (
        not isinstance(doc, dict)
        or not isinstance(doc.get("username"), str)
        or not isinstance(doc.get("password"), str)
    ):
        raise CredentialsError(f"{where} must be an object with string username and password")
    return Credential(doc["username"], doc["password"])


def _read(path: Path) -> dict[str, Any]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise CredentialsError(f"the BMC credentials file {path} does not exist") from None
    except OSError as e:
        raise CredentialsError(f"the BMC credentials file {path} cannot be opened: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise CredentialsError(f"the BMC credentials file {path} is not a regular file")
        if st.st_mode & 0o077:
            raise CredentialsError(
                f"the BMC credentials file {path} is mode {stat.S_IMODE(st.st_mode):04o}: it must be 0600 (chmod 600)"
            )
        raw = f.read(1 << 20)
    return parse(raw, f"the BMC credentials file {path}")


def parse(raw: bytes, where: str) -> dict[str, Any]:
    """The document (`where` names its source in the errors, which never quote its bytes)."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        raise CredentialsError(f"{where} is not JSON") from None
    if not isinstance(doc, dict):
        raise CredentialsError(f"{where} must hold a JSON object")
    return doc


def pick(doc: dict[str, Any], machine: str, where: str) -> Credential:
    """The machine's credential, else the document's default; CredentialsError when neither is there."""
    machines = doc.get("machines", {})
    if not isinstance(machines, dict):
        raise CredentialsError(f"{where}: machines must be an object")
    if machine in machines:
        return _entry(machines[machine], f"the credentials of {machine!r}")
    if "default" in doc:
        return _entry(doc["default"], "the default credentials")
    raise CredentialsError(f"{where} has no entry for {machine!r} and no default")


def load(path: Path, machine: str) -> Credential:
    """The machine's credential, else the file's default; CredentialsError when neither is there or the file is bad."""
    return pick(_read(path), machine, f"the BMC credentials file {path}")


def _write(path: Path, doc: dict[str, Any]) -> None:
    """The whole file, atomically and 0600: a tmp file beside it, fsynced, renamed over it, the dir fsynced."""
    tmp = path.with_name(f".{path.name}.new")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, json.dumps(doc, indent=2, sort_keys=True).encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _machines(doc: dict[str, Any], path: Path) -> dict[str, Any]:
    machines = doc.setdefault("machines", {})
    if not isinstance(machines, dict):
        raise CredentialsError(f"the BMC credentials file {path}: machines must be an object")
    return machines


def stage(path: Path, machine: str, current: Credential, username: str, password: str) -> None:
    """Before a rotation touches the BMC: the new password is written as the machine's `pending` entry beside
    the one in use, so a crash or a failed write after the BMC took it never loses access."""
    doc = _read(path)
    entry: dict[str, Any] = {"username": current.username, "password": current.password}
    entry["pending"] = {"username": username, "password": password}
    _machines(doc, path)[machine] = entry
    _write(path, doc)


def commit(path: Path, machine: str) -> None:
    """After the BMC took it: the pending entry becomes the machine's credential."""
    doc = _read(path)
    entry = _machines(doc, path).get(machine)
    if not isinstance(entry, dict) or not isinstance(entry.get("pending"), dict):
        raise CredentialsError(f"the BMC credentials file {path} lost {machine!r}'s pending password")
    pending = entry["pending"]
    _machines(doc, path)[machine] = {"username": pending["username"], "password": pending["password"]}
    _write(path, doc)


def unstage(path: Path, machine: str) -> None:
    """The BMC refused the new password: the pending entry goes, the one in use stays."""
    doc = _read(path)
    entry = _machines(doc, path).get(machine)
    if isinstance(entry, dict) and entry.pop("pending", None) is not None:
        _write(path, doc)
