"""A real Redfish BMC for the site's tests: sushy-tools' emulator (fake driver) behind a small HTTP edge.

`sushy-emulator --fake` (sushy-tools from PyPI, pinned in constraints.txt; its fake driver needs neither
libvirt nor libvirt-python) serves the systems, power, boot override and virtual media. What the emulator
lacks in that mode is faked at the HTTP edge in front of it, and nowhere else (docs/metal.md names them):

* `UpdateService.SimpleUpdate`: the fake driver has no firmware versions and answers 500; the edge
  accepts the update (202 with a task) and records it;
* `Systems/<id>/Storage…`: the fake driver has no storage; the edge serves one controller with two drives
  and lets volumes be created and deleted;
* `AccountService`: the emulator has none; the edge holds the accounts, and so checks every request's
  Basic credentials itself (401 for a wrong one), which is how a rotated password is seen to work.

Everything else is forwarded to the emulator unchanged. Both run on 127.0.0.1 on ports of their own.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

SYSTEM_UUID = "27946b59-9e44-4fa7-8e91-f3527a1ef094"
SYSTEM_MAC = "00:5c:52:31:3a:9c"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def emulator_binary() -> str:
    found = shutil.which("sushy-emulator") or str(Path(sys.executable).parent / "sushy-emulator")
    return found


@dataclass
class EdgeState:
    accounts: dict[str, str] = field(default_factory=lambda: {"admin": "old-password"})
    updates: list[dict[str, Any]] = field(default_factory=list)
    volumes: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _storage_base(path: str) -> str | None:
    prefix = f"/redfish/v1/Systems/{SYSTEM_UUID}/Storage"
    return path[len(prefix) :] if path.startswith(prefix) else None


def _handler(upstream: int, state: EdgeState) -> type[BaseHTTPRequestHandler]:
    class Edge(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, status: int, doc: Any = None, headers: dict[str, str] | None = None) -> None:
            body = json.dumps(doc).encode() if doc is not None else b""
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")  # else urllib3 pools a connection this server then closes
            self.close_connection = True
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def _body(self) -> Any:
            n = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(n) if n else b""
            return json.loads(raw) if raw else None

        def _authorized(self) -> bool:
            if self.path.rstrip("/") == "/redfish/v1":  # the service root is public, as on real BMCs
                return True
            auth = self.headers.get("Authorization", "")
            if not auth.startswith("Basic "):
                return False
            user, _, password = base64.b64decode(auth[6:]).decode().partition(":")
            with state.lock:
                return state.accounts.get(user) == password

        def _handle(self) -> None:
            path = self.path.split("?", 1)[0]
            with state.lock:
                state.requests.append((self.command, path))
            body = self._body()
            if not self._authorized():
                return self._send(401, {"error": {"message": "bad credentials"}})
            if self._faked(path, body):
                return None
            return self._forward(path, body)

        def _faked(self, path: str, body: Any) -> bool:
            if path == "/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate" and self.command == "POST":
                with state.lock:
                    state.updates.append(body)
                self._send(202, None, {"Location": "/redfish/v1/TaskService/Tasks/42"})
                return True
            if path.startswith("/redfish/v1/AccountService"):
                self._accounts(path, body)
                return True
            rest = _storage_base(path)
            if rest is not None:
                self._storage(rest.rstrip("/"), body)
                return True
            return False

        def _accounts(self, path: str, body: Any) -> None:
            with state.lock:
                names = sorted(state.accounts)
            base = "/redfish/v1/AccountService/Accounts"
            if path.rstrip("/") == base:
                members = [{"@odata.id": f"{base}/{i}"} for i in range(len(names))]
                return self._send(200, {"@odata.id": base, "Members": members, "Members@odata.count": len(names)})
            if path.startswith(base + "/"):
                i = int(path.rsplit("/", 1)[1])
                user = names[i]
                if self.command == "PATCH":
                    with state.lock:
                        state.accounts[user] = body["Password"]
                    return self._send(204)
                return self._send(200, {"@odata.id": path, "Id": str(i), "UserName": user, "Password": None})
            return self._send(404, {"error": {"message": "no such resource"}})

        def _storage(self, rest: str, body: Any) -> None:
            sys_base = f"/redfish/v1/Systems/{SYSTEM_UUID}/Storage"
            if rest == "":
                return self._send(200, {"@odata.id": sys_base, "Members": [{"@odata.id": f"{sys_base}/1"}]})
            if rest == "/1":
                drives = [{"@odata.id": f"{sys_base}/1/Drives/{d}"} for d in ("d0", "d1")]
                return self._send(
                    200,
                    {
                        "@odata.id": f"{sys_base}/1",
                        "Id": "1",
                        "Name": "RAID controller",
                        "Drives": drives,
                        "Volumes": {"@odata.id": f"{sys_base}/1/Volumes"},
                    },
                )
            if rest.startswith("/1/Drives/"):
                d = rest.rsplit("/", 1)[1]
                doc = {"@odata.id": sys_base + rest, "Id": d, "Name": f"Drive {d}", "CapacityBytes": 960197124096}
                return self._send(200, {**doc, "MediaType": "SSD", "Protocol": "NVMe"})
            vols = f"{sys_base}/1/Volumes"
            if rest == "/1/Volumes":
                if self.command == "POST":
                    with state.lock:
                        vid = str(len(state.volumes) + 1)
                        state.volumes[vid] = {"@odata.id": f"{vols}/{vid}", "Id": vid, **body}
                    return self._send(201, None, {"Location": f"{vols}/{vid}"})
                with state.lock:
                    members = [{"@odata.id": v["@odata.id"]} for v in state.volumes.values()]
                return self._send(200, {"@odata.id": vols, "Members": members, "Members@odata.count": len(members)})
            if rest.startswith("/1/Volumes/"):
                vid = rest.rsplit("/", 1)[1]
                with state.lock:
                    vol = state.volumes.get(vid)
                    if vol is not None and self.command == "DELETE":
                        del state.volumes[vid]
                        return self._send(204)
                if vol is None:
                    return self._send(404, {"error": {"message": "no such volume"}})
                return self._send(200, vol)
            return self._send(404, {"error": {"message": "no such resource"}})

        def _forward(self, path: str, body: Any) -> None:
            conn = http.client.HTTPConnection("127.0.0.1", upstream, timeout=30)
            headers = {"Content-Type": "application/json"} if body is not None else {}
            try:
                conn.request(self.command, self.path, json.dumps(body) if body is not None else None, headers)
                resp = conn.getresponse()
                data = resp.read()
            finally:
                conn.close()
            self.send_response(resp.status)
            for k, v in resp.getheaders():
                if k.lower() not in ("content-length", "connection", "transfer-encoding", "server", "date"):
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Connection", "close")
            self.close_connection = True
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _handle

    return Edge


@dataclass
class RedfishBmcUnderTest:
    url: str
    """The edge's root URL: what a site section's `bmc_url` names."""
    emulator_url: str
    state: EdgeState


def _wait_answering(port: int, proc: subprocess.Popen[bytes], deadline_s: float = 30.0) -> None:
    """Until the emulator answers its service root (it has started), or it exits, or the deadline passes."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"sushy-emulator exited {proc.returncode}")
        with contextlib.suppress(OSError):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            try:
                conn.request("GET", "/redfish/v1/")
                if conn.getresponse().status == 200:
                    return
            finally:
                conn.close()
        time.sleep(0.05)  # polling a starting process's port: there is no event to wait on
    raise RuntimeError("sushy-emulator did not answer within 30 s")


@contextlib.contextmanager
def redfish_bmc(tmp: Path) -> Iterator[RedfishBmcUnderTest]:
    """Start the emulator (fake driver, state under `tmp`) and its edge; stop both at the end."""
    port = _free_port()
    config = tmp / "emulator.conf"
    config.write_text(
        "SUSHY_EMULATOR_FAKE_SYSTEMS = "
        + repr(
            [
                {
                    "uuid": SYSTEM_UUID,
                    "name": "fake",
                    "power_state": "Off",
                    "nics": [{"mac": SYSTEM_MAC, "ip": "10.0.0.9"}],
                }
            ]
        )
        + f"\nSUSHY_EMULATOR_STATE_DIR = {str(tmp / 'emulator-state')!r}\n"
    )
    env = {**os.environ, "HOME": str(tmp), "SUSHY_EMULATOR_CONFIG": str(config)}
    log = open(tmp / "emulator.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [emulator_binary(), "--fake", "-i", "127.0.0.1", "--port", str(port), "--config", str(config)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=tmp,
    )
    state = EdgeState()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(port, state))
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), name="redfish-edge", daemon=True)
    try:
        _wait_answering(port, proc)
        thread.start()
        yield RedfishBmcUnderTest(f"http://127.0.0.1:{server.server_address[1]}", f"http://127.0.0.1:{port}", state)
    finally:
        if thread.is_alive():
            server.shutdown()
            thread.join()
        server.server_close()
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@contextlib.contextmanager
def black_hole() -> Iterator[str]:
    """A BMC that accepts connections and never answers: its root URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()
