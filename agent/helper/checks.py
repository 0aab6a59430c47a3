"""`bc doctor`'s two checks of an unprivileged node: the agent is not root, and its helper answers.

They run when the node is set up for the helper (its data dir is not root's, or the helper's socket exists,
or `bc doctor --helper-socket` names one); a node run as root without a helper gets neither.
"""

from __future__ import annotations

import pwd
import socket
import stat
from pathlib import Path

from agent.helper import ops, update_ops, wire
from bc.protocol.findings import Finding, failed, passed, warned

DEFAULT_SOCKET = Path("/run/bc-helper/helper.sock")
TIMEOUT_S = 3.0
INSTALL = "bc unit print helper > /etc/systemd/system/bc-helper.service (docs/node-security.md)"


def applies(data_dir: Path, helper_socket: Path | None) -> bool:
    try:
        owner = data_dir.stat().st_uid
    except OSError:
        return helper_socket is not None
    return helper_socket is not None or owner != 0 or DEFAULT_SOCKET.exists()


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def check_not_root(data_dir: Path) -> Finding:
    """The agent runs as the owner of its data dir (its unit's StateDirectory=)."""
    uid = data_dir.stat().st_uid
    if uid == 0:
        return failed(
            "privileges",
            f"{data_dir} is root's, so bc node runs as root: a bug in its network-facing code is a root bug",
            f"run bc node as its own user beside bc helper: bc unit print node; chown -R bc: {data_dir}",
        )
    return passed("privileges", f"bc node runs as {_user(uid)}, not root")


def hello(path: Path, timeout: float = TIMEOUT_S) -> dict[str, object]:
    """The helper's `helper.hello` answer (blocking: doctor is synchronous). OSError or WireError when not."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(path))
        s.sendall(wire.encode({"v": ops.VERSION, "op": "helper.hello"}))
        head = _read(s, 4)
        return wire.decode_body(_read(s, wire.decode_length(head)))


def _read(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the helper closed the connection")
        buf += chunk
    return buf


def check_helper(path: Path) -> Finding:
    return helper_answer(path)[0]


def helper_answer(path: Path) -> tuple[Finding, dict[str, object] | None]:
    """`check_helper`'s finding, and the helper's `helper.hello` result when it answered."""
    try:
        reply = hello(path)
    except (OSError, wire.WireError) as e:
        return failed(
            "helper",
            f"bc helper does not answer at {path}: {getattr(e, 'strerror', None) or e}",
            f"systemctl start bc-helper.service; if it is not installed: {INSTALL}",
        ), None
    if reply.get("ok") is not True or not isinstance(reply.get("result"), dict):
        return failed(
            "helper",
            f"bc helper at {path} refused this user: {reply.get('error')}",
            "run bc doctor as the node's user (runuser -u bc -- bc doctor ...): the helper serves that user only",
        ), None
    result: dict[str, object] = reply["result"]  # type: ignore[assignment]
    version, root = result.get("version"), result.get("root")
    return passed("helper", f"bc helper answers at {path} (protocol {version}, root {root})"), result


ROOTS_FIX = (
    "put the public halves of the release roots there, root's and 0644: openssl pkey -in ROOT-KEY-FILE -pubout"
    " > release-roots.pem; install -D -m 0644 release-roots.pem {path} (docs/node-security.md)"
)


def check_release_roots(path: Path, owner: int = 0) -> Finding:
    """The file the helper checks every self-update against (`update.install`), judged by the helper's own
    rule (`update_effects.read_roots`): a regular file of the helper's user (`owner`, root on a host) that
    no one else may write, listing at least one Ed25519 public key. Missing is a warning: the node runs, and
    the helper refuses every self-update."""
    fix = ROOTS_FIX.format(path=path)
    try:
        st = path.lstat()
    except FileNotFoundError:
        return warned("release-roots", f"{path} does not exist, so bc helper refuses every self-update", fix)
    except OSError as e:
        return failed("release-roots", f"cannot read {path}: {e.strerror or e}", fix)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != owner or st.st_mode & 0o022:
        return failed(
            "release-roots",
            f"{path} must be a regular file of {_user(owner)} that no one else may write: bc helper refuses it",
            fix,
        )
    try:
        keys = update_ops.parse_roots(path.read_bytes()[: update_ops.MAX_ROOTS_BYTES + 1])
    except OSError as e:
        return failed("release-roots", f"cannot read {path}: {e.strerror or e}", fix)
    except ops.Refused as e:
        return failed("release-roots", f"{path}: {e}", fix)
    n = len(keys)
    return passed("release-roots", f"{path} lists {n} release root{'s' if n != 1 else ''} bc helper trusts")
