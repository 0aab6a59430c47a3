"""A health policy's pre-approvals: the quorum's own signatures over a policy version, checked by both ends. Pure.

A health policy version may name **pre-approvals** (docs/health.md): a destructive kind the health reconciler
may run without a batch of its own, on the nodes of a pool (a label selector), until an expiry:

    "preapprove": [{"kind": "gpu.reset", "pool": {"pool": "a"}, "expires_at_ms": 1790000000000}]

Such a version pre-approves nothing by itself: no flag, no admin, no control plane makes it count. It counts
only once k approvers signed that exact version with `bc approve sign`, as a one-leaf batch of kind
`health.preapprove` whose leaf is

    leaf_bytes("health-policy", "health.preapprove", policy_digest(version, policy_json))
    policy_digest = SHA-256("bc.v1/health-policy\\n" + version + "\\n" + policy_json)

(`policy_json` the version's stored canonical text), so the signed root covers the version number and every
byte of the policy: another version, or one byte changed, is another root that nobody signed.

The node checks it itself before it runs the destructive command (`check`, from `agent/quorum.py`): the
leaf rebuilt from the text the command carries is the signed root's only leaf; k signatures of distinct
approver keys of the node's own trust bundle (`bc.pki.quorum.count_approvals`: distinct operators, never the
requester's, unexpired at server time); and an entry of that text whose kind is the command's, whose pool
is among the node's own labels, and which has not expired. The control plane runs the same `covering` rule
to decide whether to attach the version (`bc.jobs.health`), but its word counts for nothing on the node.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from bc.errors import UsageError
from bc.pki import merkle
from bc.pki import quorum as q
from bc.protocol import labels as node_labels
from bc.protocol.pb import common_pb2

BATCH_KIND = "health.preapprove"
LEAF_SUBJECT = "health-policy"
KINDS: tuple[str, ...] = ("gpu.reset", "node.reboot")
"""The destructive kinds the health reconciler runs, and so the only ones a policy may pre-approve."""
MAX_ENTRIES = 16
MAX_LIFETIME_MS = 90 * 86_400_000
"""A pre-approval expires at most 90 days after the version is set: the quorum is asked again at least that often."""


@dataclass(frozen=True)
class Preapproval:
    kind: str
    pool: tuple[tuple[str, str], ...]  # (label key, value), sorted: every pair must be on the node
    expires_at_ms: int

    def doc(self) -> dict[str, object]:
        return {"kind": self.kind, "pool": dict(self.pool), "expires_at_ms": self.expires_at_ms}

    def pool_text(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.pool)

    def describe(self) -> str:
        return f"{self.kind} in pool {self.pool_text()}"


def selector_matches(pool: Iterable[tuple[str, str]], labels: Mapping[str, str]) -> bool:
    """Every (key, value) of the pool is among the labels (an empty pool is never given: `entries` refuses it)."""
    pairs = list(pool)
    return bool(pairs) and all(k in labels and labels[k] == v for k, v in pairs)


def why_not(p: Preapproval, kind: str, labels: Mapping[str, str], now_ms: int) -> str | None:
    """None when `p` covers `kind` on a node with `labels` at `now_ms`, else why not (one clause)."""
    if p.kind != kind:
        return f"it pre-approves {p.kind}, not {kind}"
    if not selector_matches(p.pool, labels):
        return f"the node is not in pool {p.pool_text()}"
    if p.expires_at_ms <= now_ms:
        return f"its {p.describe()} expired"
    return None


def covering(
    entries: Iterable[Preapproval], kind: str, labels: Mapping[str, str], now_ms: int
) -> tuple[Preapproval | None, str]:
    """(the first entry covering `kind` on this node now, "") or (None, why none does)."""
    whys: list[str] = []
    for p in entries:
        why = why_not(p, kind, labels, now_ms)
        if why is None:
            return p, ""
        whys.append(why)
    return None, "; ".join(dict.fromkeys(whys)) or "the policy pre-approves nothing"


# -- the entries: one validation, for the admin who sets them and the node that reads them -------------


def entries(value: object) -> tuple[Preapproval, ...]:
    """The `preapprove` list of a policy, or one UsageError naming the first thing wrong."""
    if not isinstance(value, list):
        raise UsageError("preapprove must be a list of {kind, pool, expires_at_ms} objects")
    if len(value) > MAX_ENTRIES:
        raise UsageError(f"the policy has {len(value)} pre-approvals; at most {MAX_ENTRIES}")
    out: list[Preapproval] = []
    for i, e in enumerate(value, start=1):
        where = f"pre-approval {i}"
        if not isinstance(e, dict):
            raise UsageError(f"{where} must be an object with kind, pool and expires_at_ms")
        unknown = sorted(set(e) - {"kind", "pool", "expires_at_ms"})
        if unknown:
            raise UsageError(f"{where} has an unknown key {unknown[0]!r}; its keys are expires_at_ms, kind, pool")
        kind, pool, expires = e.get("kind"), e.get("pool"), e.get("expires_at_ms")
        if kind not in KINDS:
            raise UsageError(f"{where}: kind must be one of {', '.join(KINDS)}, not {json.dumps(kind)[:40]}")
        if not isinstance(pool, dict) or not pool:
            raise UsageError(f'{where}: pool must be a non-empty object of labels (like {{"pool": "a"}})')
        for k, v in pool.items():
            if not isinstance(v, str):
                raise UsageError(f"{where}: the value of label {k} must be a string")
            node_labels.check_key(k)
            node_labels.check_value(k, v)
            if node_labels.is_system(k):
                raise UsageError(f"{where}: label {k} is the system's; a pool names the labels an operator sets")
        if isinstance(expires, bool) or not isinstance(expires, int) or expires <= 0:
            raise UsageError(f"{where}: expires_at_ms must be a time in milliseconds since 1970, not {expires!r}"[:160])
        out.append(Preapproval(str(kind), tuple(sorted((str(k), str(v)) for k, v in pool.items())), expires))
    return tuple(out)


def check_lifetimes(found: Iterable[Preapproval], now_ms: int) -> None:
    """At set time: each entry expires in the future and within `MAX_LIFETIME_MS` (a UsageError otherwise)."""
    for i, p in enumerate(found, start=1):
        if p.expires_at_ms <= now_ms:
            raise UsageError(f"pre-approval {i} ({p.describe()}) has already expired")
        if p.expires_at_ms - now_ms > MAX_LIFETIME_MS:
            raise UsageError(f"pre-approval {i} ({p.describe()}) expires more than 90 days from now")


def entries_of_policy(policy_json: str) -> tuple[Preapproval, ...]:
    """The pre-approvals in a stored policy text (none when it names none); UsageError when it cannot be read."""
    try:
        doc = json.loads(policy_json)
    except ValueError:
        raise UsageError("the policy text is not JSON") from None
    if not isinstance(doc, dict):
        raise UsageError("the policy text is not a JSON object")
    return entries(doc.get("preapprove", []))


# -- what the quorum signs ---------------------------------------------------------------------------------


def policy_digest(version: int, policy_json: str) -> bytes:
    return hashlib.sha256(f"bc.v1/health-policy\n{version}\n{policy_json}".encode()).digest()


def leaf(version: int, policy_json: str) -> bytes:
    return merkle.leaf_bytes(LEAF_SUBJECT, BATCH_KIND, policy_digest(version, policy_json))


def scope_root(version: int, policy_json: str) -> bytes:
    return merkle.merkle_root([leaf(version, policy_json)])


def payload_of(payload_json: str) -> tuple[int, str]:
    """(version, policy text) of a `health.preapprove` batch's payload; UsageError when it is not one."""
    try:
        doc = json.loads(payload_json or "{}")
        version, text = doc["version"], doc["policy_json"]
    except (ValueError, KeyError, TypeError):
        raise UsageError("the health.preapprove payload does not name a policy version and its text") from None
    if isinstance(version, bool) or not isinstance(version, int) or not isinstance(text, str):
        raise UsageError("the health.preapprove payload does not name a policy version and its text")
    return version, text


def summary(payload_json: str) -> str:
    """What a `health.preapprove` batch approves, from its payload (what the approver signs, not the server's
    word): `health policy v3 pre-approves gpu.reset in pool pool=a until 2026-12-08T10:00:00Z`."""
    version, text = payload_of(payload_json)
    found = entries_of_policy(text)
    parts = [f"{p.describe()} until {_iso(p.expires_at_ms)}" for p in found]
    return f"health policy v{version} pre-approves " + ("; ".join(parts) or "nothing")


def _iso(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def check(
    blob: bytes,
    kind: str,
    labels: Mapping[str, str],
    bundle: common_pb2.TrustBundle,
    server_now_ms: int,
    count: q.CountApprovals = q.count_approvals,
) -> str | None:
    """The node's check of a command's pre-approval (a serialized HealthPreapproval): None when it holds,
    else why not, in one sentence. `count` is the quorum rule (a seam for `bc sim --break`)."""
    pre, approval = common_pb2.HealthPreapproval(), common_pb2.BatchApproval()
    try:
        pre.ParseFromString(blob)
        approval.ParseFromString(pre.batch_approval)
    except DecodeError:
        return "the pre-approval does not decode"
    if pre.policy_version <= 0 or not pre.batch_approval:
        return "the pre-approval names no signed policy version"
    v = pre.policy_version
    if approval.leaf_count != 1 or bytes(approval.scope_root) != scope_root(v, pre.policy_json):
        return f"the signatures carried are not over health policy v{v} as carried"
    tally = count(approval, list(bundle.approver_keys), server_now_ms)
    need = max(1, bundle.quorum_k)
    if len(tally.counted) < need:
        refused = "; ".join(f"{k[:19]}…: {why}" for k, why in tally.refused)
        return f"health policy v{v} holds {len(tally.counted)} of the {need} approvals it needs" + (
            f" ({refused})" if refused else ""
        )
    try:
        found = entries_of_policy(pre.policy_json)
    except UsageError as e:
        return f"health policy v{v}'s pre-approvals cannot be read: {e.message}"
    p, why = covering(found, kind, labels, server_now_ms)
    return None if p is not None else f"health policy v{v} does not pre-approve {kind} here: {why}"
