"""The node's own key as a signer: attested results and allocation reports.

The key on disk changes when the certificate is renewed (a renewal rotates
it), so the file is re-read whenever it changed; the control plane accepts a
signature by any unrevoked certificate of the node's current identity, so a
result signed just before a renewal still counts after it.

A TPM identity's node key is in the TPM, and these signatures are made
synchronously as results are sent: they are made with the session key
instead (`agent.session_key`), whose session certificate is one of the node's
unrevoked certificates (`bc.pki.session_cert`). Allocation reports, signed as
they are journaled, are signed in the TPM (`agent.app`): they may be sent long
after this process and its session key are gone.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric import ec

from bc.pki import attest, keys
from bc.protocol.pb import session_pb2

TERMINAL = frozenset(
    {
        session_pb2.COMMAND_SUCCEEDED,
        session_pb2.COMMAND_FAILED,
        session_pb2.COMMAND_REJECTED,
        session_pb2.COMMAND_CANCELLED,
    }
)


class NodeKey:
    def __init__(
        self,
        key_path: Path | None,
        key: ec.EllipticCurvePrivateKey | None = None,
        *,
        source: Callable[[], ec.EllipticCurvePrivateKey | None] | None = None,
    ) -> None:
        """The key in `key_path`, re-read when the file changes; or, with no path, `key` itself (the simulator's);
        or `source()`, a TPM identity's certified session key (`agent.session_key`), None until there is one."""
        if key_path is None and key is None and source is None:
            raise ValueError("a node key needs its file, the key or a source")
        self.path = key_path
        self._key = key
        self._source = source
        self._stamp: tuple[int, int] = (0, 0)

    def ready(self) -> bool:
        """Whether there is a key to sign with (a session key may not be certified yet)."""
        return self._source is None or self._source() is not None

    def _current(self) -> ec.EllipticCurvePrivateKey:
        if self._source is not None:
            key = self._source()
            if key is None:
                raise RuntimeError("no session key is certified yet")
            return key
        if self.path is None:
            assert self._key is not None
            return self._key
        st = os.stat(self.path)
        stamp = (st.st_mtime_ns, st.st_ino)
        if self._key is None or stamp != self._stamp:
            self._key = keys.load_key_pem(self.path.read_bytes())
            self._stamp = stamp
        return self._key

    def sign(self, message: bytes) -> bytes:
        return attest.sign(self._current(), message)

    def attest_update(self, update: session_pb2.CommandUpdate) -> session_pb2.CommandUpdate:
        """Sign a terminal result in place (idempotent); progress updates carry no signature. Without a
        certified session key yet the result stays unsigned: it is sent over a session only, which has one, and
        the session signs what it sends from the journal."""
        if update.state in TERMINAL and not update.node_sig and self.ready():
            msg = attest.result_message(update.command_id, session_pb2.CommandState.Name(update.state), update.result)
            update.node_sig = self.sign(msg)
        return update

    def sign_report(self, body: bytes) -> session_pb2.AttestedReport:
        return session_pb2.AttestedReport(body=body, node_sig=self.sign(attest.report_message(body)))
