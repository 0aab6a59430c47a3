"""What the node trusts, and the checks that follow from it (reference: "Signed commands and attested results").

The trust bundle arrives with the join (over TLS to the CA the token pinned)
and again in every Welcome. Rules:

* Nothing is enforced until the bundle holds command-signing roots. From then
  on every command, whatever its kind, and every spec must carry a valid
  signature by a worker key that chains to a held root. Whether a signature
  is required depends only on the bundle, never on a field of the body.
* A bundle offered in a Welcome replaces the held one only when it is signed
  (purpose `trust-bundle`) by a held root or a worker of one, and names the CA
  this node pinned at join. The quorum's settings (approver keys, k, the
  unbatched allowance) change only under a root's own signature: a stolen
  worker key cannot switch the quorum off. A gateway therefore cannot strip the roots (to
  slip in unsigned intent) nor add its own. A node holding no roots (joined
  before signing was turned on) takes a bundle signed by one of the roots it
  carries, trust on first use; an unsigned bundle never brings roots. Such a
  node could be pinned to a gateway's own root, so turning signing on for an
  old install is best followed by re-joining its nodes (docs/design.md).

All of this is pure; `agent.main` persists the held bundle in identity.json.
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf.message import DecodeError

from bc.pki.signing import PURPOSE_COMMAND, PURPOSE_DESIRED_STATE, PURPOSE_TRUST_BUNDLE, BadSignature, Verifier
from bc.protocol.pb import common_pb2, session_pb2


@dataclass(frozen=True)
class BundleDecision:
    bundle: common_pb2.TrustBundle | None  # the bundle to hold from now on; None keeps the current one
    reason: str


def decide_bundle(
    current: common_pb2.TrustBundle,
    offered_env: common_pb2.Envelope | None,
    offered_plain: common_pb2.TrustBundle | None,
    pinned_ca_pem: bytes,
    at: float | None,
) -> BundleDecision:
    """Which trust bundle to hold after a Welcome (or a Renew) offered these."""
    holding_roots = bool(current.command_signing_roots)
    if offered_env is not None and offered_env.body:
        offered = common_pb2.TrustBundle()
        try:
            offered.ParseFromString(offered_env.body)
        except DecodeError:
            return BundleDecision(None, "the signed trust bundle does not decode")
        if pinned_ca_pem and offered.ca_pem.strip() != pinned_ca_pem.strip():
            return BundleDecision(None, "the trust bundle names another CA than the one pinned at join")
        roots = list(current.command_signing_roots) if holding_roots else list(offered.command_signing_roots)
        verifier = Verifier(roots)
        by_root = verifier.verify_by_root(offered_env, PURPOSE_TRUST_BUNDLE)
        if not by_root:
            try:
                verifier.verify(offered_env, PURPOSE_TRUST_BUNDLE, at)
            except BadSignature as e:
                return BundleDecision(None, f"the trust bundle's signature does not hold: {e}")
            if quorum_settings(offered) != quorum_settings(current):
                return BundleDecision(
                    None, "the approver keys and threshold change only under the signing root's own signature"
                )
        if offered.SerializeToString(deterministic=True) == current.SerializeToString(deterministic=True):
            return BundleDecision(None, "unchanged")
        return BundleDecision(offered, "signed by a held root" if holding_roots else "first signed bundle")
    if offered_plain is None or offered_plain.ByteSize() == 0:
        return BundleDecision(None, "no bundle offered")
    if holding_roots:
        return BundleDecision(None, "an unsigned trust bundle cannot replace one that holds command-signing roots")
    if offered_plain.command_signing_roots:
        # Roots arrive signed by themselves (or at join): an unsigned list could hold anything, even junk
        # that would leave this node refusing the real server's bundle for good.
        return BundleDecision(None, "an unsigned trust bundle cannot bring command-signing roots")
    if pinned_ca_pem and offered_plain.ca_pem and offered_plain.ca_pem.strip() != pinned_ca_pem.strip():
        return BundleDecision(None, "the trust bundle names another CA than the one pinned at join")
    if offered_plain.SerializeToString(deterministic=True) == current.SerializeToString(deterministic=True):
        return BundleDecision(None, "unchanged")
    return BundleDecision(offered_plain, "no roots held yet")


def quorum_settings(b: common_pb2.TrustBundle) -> bytes:
    """What only the root may change: the approvers, k and the unbatched allowance."""
    q = common_pb2.TrustBundle(quorum_k=b.quorum_k, unbatched_destructive_per_hour=b.unbatched_destructive_per_hour)
    q.approver_keys.extend(b.approver_keys)
    return q.SerializeToString(deterministic=True)


class AgentTrust:
    """The held bundle and its verifier: the signature checks of commands and specs."""

    def __init__(self, bundle: common_pb2.TrustBundle) -> None:
        self.set(bundle)

    def set(self, bundle: common_pb2.TrustBundle) -> None:
        self.bundle = bundle
        self.verifier = Verifier(list(bundle.command_signing_roots))

    @property
    def enforcing(self) -> bool:
        return self.verifier.enforcing

    def check_command(self, cmd: session_pb2.Command, at: float | None) -> str | None:
        """None when the command may run as far as signatures go; else why it is BAD_SIGNATURE."""
        if not self.enforcing:
            return None
        try:
            self.verifier.verify(cmd.envelope, PURPOSE_COMMAND, at)
        except BadSignature as e:
            return str(e)
        return None

    def check_spec(self, env: common_pb2.Envelope, at: float | None) -> str | None:
        """None when the spec may be applied; else why not (the 'always' rule once roots are held)."""
        if not self.enforcing:
            return None
        try:
            self.verifier.verify(env, PURPOSE_DESIRED_STATE, at)
        except BadSignature as e:
            return str(e)
        return None
