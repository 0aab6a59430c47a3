"""The node's identity on disk: `identity.json`, `node.key` (0600), `node.crt`, `ca.crt`.

`identity.json` also mirrors the server time mark, so a lost journal does not
reopen the clock-rewind window, and keeps the trust bundle last received.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bc.errors import UsageError

IDENTITY_FILE = "identity.json"


@dataclass
class Identity:
    node_id: str
    role: str
    server: str
    identity_generation: int
    ca_fingerprint: str
    server_time_mark_ms: int = 0
    trust_bundle_b64: str = ""
    files: dict[str, str] = field(default_factory=lambda: {"key": "node.key", "cert": "node.crt", "ca": "ca.crt"})

    @staticmethod
    def path(data_dir: Path) -> Path:
        return data_dir / IDENTITY_FILE

    @staticmethod
    def exists(data_dir: Path) -> bool:
        return Identity.path(data_dir).is_file()

    @staticmethod
    def load(data_dir: Path) -> Identity:
        p = Identity.path(data_dir)
        if not p.is_file():
            raise UsageError(f"no node identity in {data_dir}; join first with `bc join --server ... --token ...`")
        try:
            doc = json.loads(p.read_text())
            return Identity(**doc)
        except (ValueError, TypeError) as e:
            raise UsageError(f"the node identity {p} is unreadable: {e}") from None

    def save(self, data_dir: Path) -> None:
        write_atomic(Identity.path(data_dir), (json.dumps(asdict(self), indent=2) + "\n").encode(), 0o600)

    def read(self, data_dir: Path, what: str) -> bytes:
        return (data_dir / self.files[what]).read_bytes()


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write, fsync, rename, fsync the directory: the file is either old or new after a crash."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
