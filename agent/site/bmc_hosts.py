"""Every BMC host the site drove: `data_dir/bmc-hosts.json`, so `site.httpProxy` never reaches one.

A host is recorded before the first request a `bmc.*` command sends to it, and never forgotten: removing a
machine from the spec does not make its BMC a proxy target. The file is rewritten whole (tmp, fsync,
rename); a file that does not parse is an error, never an empty set, since an empty set would let the
proxy reach every BMC. Blocking: called through the agent's offload, so from several threads at once (two
machines' `bmc.*` commands run side by side): a lock makes each read-modify-write whole, or one would lose the
other's host, or find the temporary file already renamed.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

FILE = "bmc-hosts.json"


class BmcHostsError(Exception):
    pass


class BmcHosts:
    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / FILE
        self._hosts: set[str] | None = None
        self._lock = threading.Lock()

    def hosts(self) -> frozenset[str]:
        if self._hosts is None:
            self._hosts = self._load()
        return frozenset(self._hosts)

    def _load(self) -> set[str]:
        try:
            doc = json.loads(self.path.read_text())
        except FileNotFoundError:
            return set()
        except ValueError:
            raise BmcHostsError(f"{self.path} does not parse: the site refuses to proxy until it is fixed") from None
        hosts = doc.get("hosts") if isinstance(doc, dict) else None
        if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
            raise BmcHostsError(f"{self.path} is not a list of hosts: the site refuses to proxy until it is fixed")
        return {h.lower() for h in hosts}

    def remember(self, host: str) -> None:
        """Record `host` (durably) unless it is known already."""
        host = host.lower()
        with self._lock:
            current = self.hosts()
            if host in current:
                return
            hosts = sorted(current | {host})
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{FILE}.new")
            with open(tmp, "w") as f:
                json.dump({"hosts": hosts}, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
            self._hosts = set(hosts)
