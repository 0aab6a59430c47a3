"""Where things live on disk, and how the CLI finds its server.

Data dir: `--data-dir`, else `$BC_DATA_DIR`, else `/var/lib/bc` as root and
`~/.local/share/bc` otherwise.

`bc serve` leaves the local operator a client config (like a kubeconfig): the
server's address, the CA, and an operator key and certificate, in
`<data-dir>/operator/`. `bc operators add NAME` writes one file of the same
format for another person, with the PEMs inline instead of file names
(`ca`, `cert` and `key` hold either). The admin commands look for a config,
first found wins:

1. `$BC_CONFIG` (a path to a config file): when it is set, it is the only
   candidate — a missing or unreadable file is an error, never a fall-back to
   whatever other cluster's config the next places hold
2. `$BC_DATA_DIR/operator/config.json`
3. `~/.config/bc/config.json` (`bc serve` copies its config there at every start
   when that file is absent or names the same data dir — the same server, say
   after a certificate rotation — and never over one that names another data
   dir; its log says which: `user-copy-written` or `user-copy-kept`; `user_copy`)
4. `<default data dir>/operator/config.json`
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from bc.errors import UsageError
from bc.runtime.files import atomic_write, write_new
from bc.runtime.local_files import read_local_file, read_local_text


def default_data_dir() -> Path:
    env = os.environ.get("BC_DATA_DIR")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/lib/bc")
    return Path.home() / ".local" / "share" / "bc"


def user_config_path() -> Path:
    return Path.home() / ".config" / "bc" / "config.json"


@dataclass(frozen=True)
class UserCopy:
    """Whether `bc serve` may write its operator config to `~/.config/bc/config.json`, and why."""

    write: bool
    reason: str


def user_copy(there_data_dir: str | None, data_dir: str, *, unreadable: bool = False) -> UserCopy:
    """The rule for the copy in `~/.config/bc`: `there_data_dir` is the data dir the file there names
    (None: no file). Another server's config is never replaced: the operator chose it, and the next
    admin command would reach the wrong cluster with no word said."""
    if unreadable:
        return UserCopy(False, "the file there is unreadable; left as it is")
    if there_data_dir is None:
        return UserCopy(True, "absent")
    if there_data_dir == data_dir:
        return UserCopy(True, f"names this data dir ({data_dir})")
    return UserCopy(False, f"names another server's data dir ({there_data_dir or 'none'})")


def _single_doc(server: str, ca_pem: bytes, cert_pem: bytes, key_pem: bytes, data_dir: str) -> str:
    """A self-contained config file's text: the PEMs inline."""
    cfg = {
        "server": server,
        "ca": ca_pem.decode(),
        "cert": cert_pem.decode(),
        "key": key_pem.decode(),
        "data_dir": data_dir,
    }
    return json.dumps(cfg, indent=2) + "\n"


@dataclass(frozen=True)
class OperatorConfig:
    """What an admin client needs to reach `bc serve` over mutual TLS."""

    server: str
    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes
    data_dir: str
    path: Path

    @staticmethod
    def write(dir_: Path, *, server: str, ca_pem: bytes, cert_pem: bytes, key_pem: bytes, data_dir: Path) -> Path:
        """Write config.json with the key beside it (0600); returns the config path."""
        dir_.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_write(dir_ / "operator.key", key_pem, 0o600)
        atomic_write(dir_ / "operator.crt", cert_pem)
        atomic_write(dir_ / "ca.crt", ca_pem)
        cfg = {
            "server": server,
            "ca": "ca.crt",
            "cert": "operator.crt",
            "key": "operator.key",
            "data_dir": str(data_dir),
        }
        path = dir_ / "config.json"
        atomic_write(path, (json.dumps(cfg, indent=2) + "\n").encode())
        return path

    @staticmethod
    def write_single(
        path: Path, *, server: str, ca_pem: bytes, cert_pem: bytes, key_pem: bytes, data_dir: str = ""
    ) -> Path:
        """One self-contained config file (0600, PEMs inline) to hand to a person; never overwrites."""
        try:
            write_new(path, _single_doc(server, ca_pem, cert_pem, key_pem, data_dir).encode())
        except FileExistsError:
            raise UsageError(f"{path} already exists; refusing to overwrite it (choose another --out)") from None
        except OSError as e:
            raise UsageError(f"cannot write {path}: {e.strerror}") from None
        return path

    @staticmethod
    def replace_single(
        path: Path, *, server: str, ca_pem: bytes, cert_pem: bytes, key_pem: bytes, data_dir: str = ""
    ) -> Path:
        """Complete a config `write_single` made (same key): the new file (0600) is fsynced beside it, then
        renamed over it, so `path` holds the key at every moment."""
        try:
            atomic_write(path, _single_doc(server, ca_pem, cert_pem, key_pem, data_dir).encode(), 0o600)
        except OSError as e:
            raise UsageError(f"cannot write {path}: {e.strerror}") from None
        return path

    @staticmethod
    def load(path: Path) -> OperatorConfig:
        text = read_local_text(path, "the operator config")  # bounded, a regular file: exit 2 at once otherwise
        try:
            doc = json.loads(text)
            base = path.parent

            def pem(name: str) -> bytes:
                value = str(doc[name])
                if value.lstrip().startswith("-----BEGIN "):
                    return value.encode()
                p = Path(value)
                return read_local_file(p if p.is_absolute() else base / p, name)

            return OperatorConfig(
                server=str(doc["server"]),
                ca_pem=pem("ca"),
                cert_pem=pem("cert"),
                key_pem=pem("key"),
                data_dir=str(doc.get("data_dir", "")),
                path=path,
            )
        except (OSError, KeyError, ValueError, TypeError, AttributeError) as e:
            raise UsageError(f"the operator config {path} is unreadable: {e}") from None
        except UsageError as e:  # a PEM file it names that is not a bounded regular file
            raise UsageError(f"the operator config {path} is unreadable: {e.message}") from None


def operator_config_candidates() -> list[Path]:
    out: list[Path] = []
    if os.environ.get("BC_CONFIG"):
        out.append(Path(os.environ["BC_CONFIG"]))
    if os.environ.get("BC_DATA_DIR"):
        out.append(Path(os.environ["BC_DATA_DIR"]) / "operator" / "config.json")
    out.append(user_config_path())
    if os.geteuid() == 0:
        out.append(Path("/var/lib/bc/operator/config.json"))
    else:
        out.append(Path.home() / ".local" / "share" / "bc" / "operator" / "config.json")
    return out


def find_operator_config() -> OperatorConfig:
    explicit = os.environ.get("BC_CONFIG")
    if explicit:
        # Named explicitly: this file or an error, never another cluster's config found further down the list.
        path = Path(explicit)
        if not path.is_file():
            raise UsageError(f"BC_CONFIG names {path}, which is not a file; fix BC_CONFIG or unset it")
        return OperatorConfig.load(path)
    for p in operator_config_candidates():
        if p.is_file():
            return OperatorConfig.load(p)
    tried = ", ".join(str(p) for p in operator_config_candidates())
    raise UsageError(f"no operator config found (tried {tried}); run `bc serve` first or set BC_CONFIG / BC_DATA_DIR")
