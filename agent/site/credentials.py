"""BMC credentials: a 0600 JSON file on the site host, named by the `site` section's `credentials_file`.

Until the secret broker exists this file is where a site keeps them (docs/metal.md); a spec or a command
never carries one. The file:

    {"default": {"username": "admin", "password": "..."},
     "machines": {"rack1-n01": {"username": "root", "password": "..."}}}

It is refused, and no BMC is driven with it, when anyone but its owner may read or write it (mode & 0o077),
when it is not a regular file, or when it is not that shape. `bmc.rotate` replaces one machine's password:
the new file is written beside the old one, 0600, fsynced and renamed over it, so a crash leaves either.
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
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        raise CredentialsError(f"the BMC credentials file {path} is not JSON") from None
    if not isinstance(doc, dict):
        raise CredentialsError(f"the BMC credentials file {path} must hold a JSON object")
    return doc


def load(path: Path, machine: str) -> Credential:
    """The machine's credential, else the file's default; CredentialsError when neither is there or the file is bad."""
    doc = _read(path)
    machines = doc.get("machines", {})
    if not isinstance(machines, dict):
        raise CredentialsError(f"the BMC credentials file {path}: machines must be an object")
    if machine in machines:
        return _entry(machines[machine], f"the credentials of {machine!r}")
    if "default" in doc:
        return _entry(doc["default"], "the default credentials")
    raise CredentialsError(f"the BMC credentials file {path} has no entry for {machine!r} and no default")


def replace(path: Path, machine: str, credential: Credential) -> None:
    """Write `credential` as the machine's entry, atomically and 0600 (the rest of the file unchanged)."""
    doc = _read(path)
    machines = doc.setdefault("machines", {})
    if not isinstance(machines, dict):
        raise CredentialsError(f"the BMC credentials file {path}: machines must be an object")
    machines[machine] = {"username": credential.username, "password": credential.password}
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
