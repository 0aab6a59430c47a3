"""The key a worker-only `bc serve --roles worker` signs with: the worker key from its own files, checked.

A worker process signs what its loops write (a job's commands, the placement pass's specs, the specs a
gateway left pending) and nothing else, so the worker key is all it reads: `pki/signing/worker.key`,
`worker.crt` and `root.crt` (the root's certificate, to name the chain), copied from an api process.
Every refusal is one sentence and happens before anything is written: a worker that signed with a key
the nodes do not trust would leave every spec it touched undeliverable.
"""

from __future__ import annotations

import logging
from pathlib import Path

from bc.control.signing.signer import KeylessSigner, KeySigner, NullSigner, Signer
from bc.errors import UsageError
from bc.pki import keys
from bc.pki.signing import ROOT_KEY, SIGNING_DIR, WORKER_ROTATE_BEFORE_S, SigningKeys
from bc.protocol.pb import common_pb2
from bc.store import Store

log = logging.getLogger("bc.serve")

COPY_HINT = "copy worker.key, worker.crt and root.crt from an api process's pki/signing/ (never root.key)"


async def worker_signer(store: Store, pki_dir: Path, published: common_pb2.TrustBundle, now: float) -> Signer:
    """KeySigner over the worker key in `pki_dir`, or NullSigner when the install does not sign."""
    signing_dir = pki_dir / SIGNING_DIR
    if not SigningKeys.exists(pki_dir):
        store_says = KeylessSigner()
        await store_says.refresh(store)
        if store_says.attested:
            raise UsageError(
                f"command signing is on for this install and {signing_dir} holds no worker key, which a worker"
                f" process signs with; {COPY_HINT}"
            )
        return NullSigner()
    sk = SigningKeys.load(pki_dir)
    roots = {keys.fingerprint(keys.load_cert_pem(pem)) for pem in published.command_signing_roots}
    if roots and keys.fingerprint(sk.root) not in roots:
        raise UsageError(
            f"the worker key in {signing_dir} is under another command-signing root than this install's"
            f" (the store's trust bundle names {', '.join(sorted(roots))}); {COPY_HINT}"
        )
    left = sk.worker.not_after - now
    if left <= 0:
        raise UsageError(
            f"the worker key in {signing_dir} has expired; rotate it on an api process (bc pki rotate) and {COPY_HINT}"
        )
    if left < WORKER_ROTATE_BEFORE_S:
        log.warning(
            "event=pki.worker-key-expiring days_left=%d hint='rotate on an api process (bc pki rotate) and copy it'",
            left // 86400,
        )
    if (signing_dir / ROOT_KEY).exists():
        # Not read: the root signs only worker certificates and quorum steps, which a worker does not make.
        log.warning("event=pki.root-key-unused path=%s hint='a worker process never reads it: remove it'", signing_dir)
    log.info("event=pki.worker-key-loaded worker=%s", sk.worker.key_id)
    return KeySigner(sk)
