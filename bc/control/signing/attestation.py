"""Checking what a node signed with its own key, before any state moves on it.

The node's key is the one in a certificate this CA issued, so the check runs
against `node_certs` (the node's unrevoked certificates of its current
identity; several, because a renewal rotates the key while results signed
with the previous one may still be in flight). Nothing a gateway says is
consulted: a gateway that forges, strips or swaps a signature gets the
report rejected.

Whether the check applies at all is the `Signer`'s to say (`attested`: on
whenever command signing is on), passed in by the caller like every other
dependency: there is no "no signer, no check" path.
"""

from __future__ import annotations

from collections import OrderedDict

from cryptography import x509

from bc.control.signing.signer import Signer
from bc.pki import attest
from bc.protocol.pb import session_pb2
from bc.store import Tx
from bc.store import revocation as rev_sql

_CERTS: OrderedDict[str, x509.Certificate] = OrderedDict()
_CERT_CACHE_MAX = 4096


def _parse(pem: str) -> x509.Certificate:
    cert = _CERTS.get(pem)
    if cert is None:
        cert = x509.load_pem_x509_certificate(pem.encode())
        _CERTS[pem] = cert
        if len(_CERTS) > _CERT_CACHE_MAX:
            _CERTS.popitem(last=False)
    else:
        _CERTS.move_to_end(pem)
    return cert


async def node_certs(tx: Tx, node_id: str) -> list[x509.Certificate]:
    return [_parse(pem) for pem in await rev_sql.live_certs(tx, node_id)]


async def check_result(tx: Tx, signer: Signer, node_id: str, update: session_pb2.CommandUpdate) -> str | None:
    """None if the node signed this result or no attestation is required; otherwise why not (`unsigned`,
    `bad-signature`)."""
    if not signer.attested:
        return None
    if not update.node_sig:
        return "unsigned"
    msg = attest.result_message(update.command_id, session_pb2.CommandState.Name(update.state), update.result)
    if attest.verify_by_any(await node_certs(tx, node_id), msg, update.node_sig):
        return None
    return "bad-signature"


async def check_report(tx: Tx, signer: Signer, node_id: str, report: session_pb2.AttestedReport) -> str | None:
    """None if the node signed this allocation report or no attestation is required; otherwise why not."""
    if not signer.attested:
        return None
    if not report.node_sig:
        return "unsigned"
    if attest.verify_by_any(await node_certs(tx, node_id), attest.report_message(report.body), report.node_sig):
        return None
    return "bad-signature"
