"""The node's own key as a signer: attested results and allocation reports.

The key on disk changes when the certificate is renewed (a renewal rotates
it), so the file is re-read whenever it changed; the control plane accepts a
signature by any unrevoked certificate of the node's current identity, so a
result signed just before a renewal still counts after it.
"""

from __future__ import annotations

import os
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
    def __init__(self, key_path: Path | None, key: ec.EllipticCurvePrivateKey | None = None) -> None:
        """The key in `key_path`, re-read when the file changes; or, with no path, `key` itself (the simulator's)."""
        if key_path is None and key is None:
            raise ValueError("a node key needs its file or the key")
        self.path = key_path
        self._key = key
        self._stamp: tuple[int, int] = (0, 0)

    def _current(self) -> ec.EllipticCurvePrivateKey:
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
        """Sign a terminal result in place (idempotent); progress updates carry no signature."""
        if update.state in TERMINAL and not update.node_sig:
            msg = attest.result_message(update.command_id, session_pb2.CommandState.Name(update.state), update.result)
            update.node_sig = self.sign(msg)
        return update

    def sign_report(self, body: bytes) -> session_pb2.AttestedReport:
        return session_pb2.AttestedReport(body=body, node_sig=self.sign(attest.report_message(body)))
