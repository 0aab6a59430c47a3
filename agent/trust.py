"""What the node trusts, and the checks that follow from it (reference: "Signed commands and attested results").

The trust bundle arrives with the join (over TLS to the CA the token pinned)
and again in every Welcome. Rules:

* Nothing is enforced until the bundle holds command-signing roots. From then
  on every command, whatever its kind, and every spec must carry a valid
  signature by a worker key that chains to a held root. Whether a signature
  is required depends only on the bundle, never on a field of the body.
* A bundle offered in a Welcome replaces the held one only when it is signed
  (purpose `trust-bundle`) by a held root or a worker of one, and names the CA
  this node pinned at join. A gateway therefore cannot strip the roots (to
  slip in unsigned intent) nor add its own.
* The release keys (`bc release key add`) change only under a root's own
  signature too: a worker key alone cannot bring a key that signs binaries. A
  worker-signed bundle may add a key that carries a held root's endorsement of
  it (`release_keys_path`; with the root kept offline the operator's machine
  makes it) and may drop none.
* The quorum's settings (approver keys, k, the unbatched allowance and their
  version) change only under a root's own signature AND a path of approved
  changes from the settings this node holds (`quorum_path`): each change in
  the bundle's `quorum_changes` must carry `change_threshold` valid signatures
  of the approvers the node holds at that step (none of the requester's), as
  TUF rotates its root. With the root kept offline the bundle is signed by
  a worker; each change on that path must then carry the root's own
  signature of its step (`QuorumChange.root_signature`). So neither a stolen worker key nor the root key alone
  can switch the quorum off or replace it; with no approvers held, the root
  alone is enough (bootstrap). A node too far behind the bundle's path keeps
  what it holds (re-join it). A node holding no roots (joined
  before signing was turned on) takes a bundle signed by one of the roots it
  carries, trust on first use; an unsigned bundle never brings roots. Such a
  node could be pinned to a gateway's own root, so turning signing on for an
  old install is best followed by re-joining its nodes (docs/design.md).

All of this is pure; `agent.session.node_state` persists the held bundle in identity.json.
"""

from __future__ import annotations

from dataclasses import dataclass

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from google.protobuf.message import DecodeError

from bc.pki import quorum as q
from bc.pki import releases
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
        root_keys: list[bytes] | None = None
        if not by_root:
            try:
                verifier.verify(offered_env, PURPOSE_TRUST_BUNDLE, at)
            except BadSignature as e:
                return BundleDecision(None, f"the trust bundle's signature does not hold: {e}")
            root_keys = root_public_keys(verifier)  # a worker-signed bundle: each quorum step needs the root's own
            why = release_keys_path(current, offered, root_keys)
            if why is not None:
                return BundleDecision(None, why)
        why = quorum_path(current, offered, root_keys)
        if why is not None:
            return BundleDecision(None, why)
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
    why = quorum_path(current, offered_plain)
    if why is not None:
        return BundleDecision(None, why)
    if offered_plain.SerializeToString(deterministic=True) == current.SerializeToString(deterministic=True):
        return BundleDecision(None, "unchanged")
    return BundleDecision(offered_plain, "no roots held yet")


def quorum_changed(held: common_pb2.TrustBundle, offered: common_pb2.TrustBundle) -> bool:
    """Whether the offered bundle moves the quorum settings (approvers, k, allowance, version)."""
    return q.settings_digest(q.settings_of(held)) != q.settings_digest(q.settings_of(offered))


def root_public_keys(verifier: Verifier) -> list[bytes]:
    """The held roots' raw Ed25519 public keys (a root of another kind signs no quorum step)."""
    out = []
    for root in verifier.roots:
        pub = root.public_key()
        if isinstance(pub, ed25519.Ed25519PublicKey):
            out.append(pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))
    return out


def release_keys_path(
    held: common_pb2.TrustBundle, offered: common_pb2.TrustBundle, root_keys: list[bytes]
) -> str | None:
    """None when a worker-signed bundle's release keys may replace the held ones: it drops none, and each key
    it adds carries a held root's endorsement (`bc.pki.releases.endorse`, `bc release key add --root-key`)."""
    if set(held.release_keys) - set(offered.release_keys):
        return "the release keys change only under the signing root's own signature"
    roots = [ed25519.Ed25519PublicKey.from_public_bytes(raw) for raw in root_keys]
    for key in set(offered.release_keys) - set(held.release_keys):
        sigs = [e.root_signature for e in offered.release_key_endorsements if e.public_key == key]
        if not any(releases.endorsed_by(root, key, sig) for root in roots for sig in sigs):
            return (
                "the release keys change only under the signing root's own signature: the new key"
                f" {releases.key_id(key)[:23]}… carries no held root's endorsement"
            )
    return None


def quorum_path(
    held: common_pb2.TrustBundle, offered: common_pb2.TrustBundle, root_keys: list[bytes] | None = None
) -> str | None:
    """None when the offered quorum settings are the held ones, or follow from them by approved changes.

    Walks `offered.quorum_changes` (oldest first) from the held settings: a
    change applies only from the settings it names by digest, only forward in
    version, and only with `change_threshold` approvals of the approvers held at
    that step; changes the node already passed are skipped. With `root_keys`
    (the bundle is signed by a worker, not by the root itself) each step taken
    must also carry a held root's own signature (`QuorumChange.root_signature`:
    the root kept offline signed it on the operator's machine).
    """
    cur = q.settings_of(held)
    digest, target = q.settings_digest(cur), q.settings_digest(q.settings_of(offered))
    for change in offered.quorum_changes:
        if digest == target:
            break
        if change.from_digest != digest:
            continue
        if change.settings.version <= cur.version:
            return f"quorum change {change.change_id} does not move the settings' version forward"
        if root_keys is not None and not q.root_signed(change, root_keys):
            return (
                "the approver keys and threshold change only under the signing root's own signature"
                f" (quorum change {change.change_id} carries none, and the bundle is the worker's)"
            )
        need = q.change_threshold(cur)
        tally = q.count_change_approvals(change, cur)
        if len(tally.counted) < need:
            refused = "; ".join(f"{k[:19]}…: {why}" for k, why in tally.refused)
            detail = f" ({refused})" if refused else ""
            return (
                f"quorum change {change.change_id} holds {len(tally.counted)} of the {need} approvals it needs"
                f" from the approvers this node holds{detail}"
            )
        cur = change.settings
        digest = q.settings_digest(cur)
    if digest != target:
        if root_keys is not None:
            return (
                "the approver keys and threshold change only under the signing root's own signature: no approved"
                " change it signed leads from the quorum settings this node holds to the offered ones"
            )
        return "no approved quorum change leads from the quorum settings this node holds to the offered ones"
    return None


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
