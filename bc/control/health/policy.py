"""The health policy: which condition gets which remediation, how drains behave, and the limits (docs/health.md).

Pure: `parse(text)` turns the JSON an admin sets (`bc health policy set`) into a `Policy` or raises one
`UsageError` naming the first thing wrong; `Policy.doc()` is the stored and shown form. Every key is
optional (a missing one takes the default below); an unknown key is refused, so a typo never silently
turns a limit off.

    {
      "enabled": true,
      "rules": [{"match": "xid:79", "action": "reset"}, {"match": "ecc", "at_least": 1, "action": "reset"}, ...],
      "drain": "wait",                 wait | ask: the job waits for the GPU's holds to end; `ask` also raises
                                       `health.drain.asked` naming them, for a person to release (never the loop)
      "drain_deadline_s": 86400,       how long the drain waits before the remediation fails (quarantine)
      "on_reset_failure": "reboot",    reboot | quarantine
      "repeat_window_s": 86400,        a GPU sick again within this long of its last remediation is quarantined
      "flap_window_s": 600,            a queued condition that clears comes back within this as the same episode
      "limits": {"max_nodes": 1, "max_fleet_percent": 10, "per_label": "", "max_actions_per_hour": 4},
      "preapprove": [{"kind": "gpu.reset", "pool": {"pool": "a"}, "expires_at_ms": 1790000000000}]
    }

Rules are read in order; the first whose `match` a condition carries (`xid:*` matches any XID) decides.
Actions: `reset` (cordon the GPU, drain, `gpu.reset`, `diag.nvml`, return), `reset-when-idle` (the same,
started only once no live hold is on the GPU), `quarantine` (cordon for good, raised for a person), `none`.
A node condition's signal (`driver-reboot`, `driver`, `fabric-manager`, `container-toolkit`, `kubernetes`:
`bc.control.health.conditions`) takes `reboot` (the node's `reboot` job: drain, `node.reboot`) or `none`;
the defaults reboot for `driver-reboot` (an installed driver that needs a reboot) and leave the others alone.

`preapprove` (none by default) names destructive kinds the reconciler may run in a pool without a batch of
their own: they count only once k approvers signed the version (`bc.pki.preapproval`, which validates them).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from bc.errors import UsageError
from bc.pki import preapproval as pre

RESET, RESET_WHEN_IDLE, QUARANTINE, NONE, REBOOT = "reset", "reset-when-idle", "quarantine", "none", "reboot"
ACTIONS: tuple[str, ...] = (RESET, RESET_WHEN_IDLE, QUARANTINE, NONE, REBOOT)
NODE_MATCHES: tuple[str, ...] = ("driver-reboot", "driver", "fabric-manager", "container-toolkit", "kubernetes")
NODE_ACTIONS: tuple[str, ...] = (REBOOT, NONE)
"""What a rule on a node condition may do; a GPU's rules may do anything else (and `none`)."""
DRAINS: tuple[str, ...] = ("wait", "ask")
ON_RESET_FAILURE: tuple[str, ...] = ("reboot", "quarantine")
MATCHES: tuple[str, ...] = ("offbus", "ecc", "remap-failed", "remap-pending", "throttle", "other", "xid:*")
MAX_RULES = 64
MAX_WINDOW_S = 30 * 86_400
MAX_POLICY_BYTES = 16_384


@dataclass(frozen=True)
class Rule:
    match: str  # a signal (`ecc`, `xid:79`) or `xid:*`
    action: str
    at_least: int = 1  # the signal's count it needs (ECC errors: a burst); 1 for the others

    def matches(self, signals: Mapping[str, int]) -> bool:
        if self.match == "xid:*":
            return any(s.startswith("xid:") for s in signals)
        return signals.get(self.match, 0) >= self.at_least


@dataclass(frozen=True)
class Limits:
    max_nodes: int = 1
    """At most this many nodes in remediation at once."""
    max_fleet_percent: int = 10
    """…and at most this share of the fleet, rounded down but never below one node (a small lab still heals)."""
    per_label: str = ""
    """A label key (`rack`, `pool`): at most one node in remediation per value of it; "" for no such limit."""
    max_actions_per_hour: int = 4
    """Automatic actions (a remediation started, a reboot after a failed reset) per rolling hour, fleet-wide."""

    def fleet_cap(self, fleet_size: int) -> int:
        """How many nodes may be in remediation at once in a fleet of `fleet_size` nodes."""
        return min(self.max_nodes, max(1, fleet_size * self.max_fleet_percent // 100))


DEFAULT_RULES: tuple[Rule, ...] = (
    Rule("remap-failed", QUARANTINE),
    Rule("offbus", RESET),
    Rule("xid:79", RESET),
    Rule("xid:74", RESET),
    Rule("xid:95", RESET),
    Rule("ecc", RESET),
    Rule("remap-pending", RESET_WHEN_IDLE),
    Rule("driver-reboot", REBOOT),
)


@dataclass(frozen=True)
class Policy:
    enabled: bool = True
    rules: tuple[Rule, ...] = DEFAULT_RULES
    drain: str = "wait"
    drain_deadline_s: int = 86_400
    on_reset_failure: str = "reboot"
    repeat_window_s: int = 86_400
    flap_window_s: int = 600
    limits: Limits = field(default_factory=Limits)
    preapprove: tuple[pre.Preapproval, ...] = ()
    """What the version pre-approves once k approvers signed it (docs/health.md); nothing before that."""

    def action_for(self, signals: Mapping[str, int]) -> tuple[str, str]:
        """(the action, the rule's match) of the first rule the signals meet; (`none`, "") when none does."""
        if not self.enabled:
            return NONE, ""
        for r in self.rules:
            if r.matches(signals):
                return r.action, r.match
        return NONE, ""

    def doc(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "rules": [
                {"match": r.match, "action": r.action, **({"at_least": r.at_least} if r.at_least != 1 else {})}
                for r in self.rules
            ],
            "drain": self.drain,
            "drain_deadline_s": self.drain_deadline_s,
            "on_reset_failure": self.on_reset_failure,
            "repeat_window_s": self.repeat_window_s,
            "flap_window_s": self.flap_window_s,
            "limits": {
                "max_nodes": self.limits.max_nodes,
                "max_fleet_percent": self.limits.max_fleet_percent,
                "per_label": self.limits.per_label,
                "max_actions_per_hour": self.limits.max_actions_per_hour,
            },
            "preapprove": [p.doc() for p in self.preapprove],
        }

    def text(self) -> str:
        return json.dumps(self.doc(), sort_keys=True, separators=(",", ":"))


DEFAULT = Policy()
UNSET = replace(DEFAULT, enabled=False)
"""In force before an admin sets any policy: the reconciler watches and acts on nothing (docs/health.md)."""

_KEYS = frozenset(Policy().doc())
_LIMIT_KEYS = frozenset(DEFAULT.doc()["limits"])


def parse(text: str) -> Policy:
    """The policy in `text` (JSON), or one UsageError naming the first thing wrong."""
    if len(text.encode()) > MAX_POLICY_BYTES:
        raise UsageError(f"the health policy is longer than {MAX_POLICY_BYTES:,} bytes")
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise UsageError(f"the health policy is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise UsageError("the health policy must be a JSON object")
    return from_doc(doc)


def from_doc(doc: Mapping[str, Any]) -> Policy:
    _known(doc, _KEYS, "the health policy")
    p = DEFAULT
    if "enabled" in doc:
        p = replace(p, enabled=_bool(doc["enabled"], "enabled"))
    if "rules" in doc:
        p = replace(p, rules=_rules(doc["rules"]))
    if "drain" in doc:
        p = replace(p, drain=_choice(doc["drain"], DRAINS, "drain"))
    if "on_reset_failure" in doc:
        p = replace(p, on_reset_failure=_choice(doc["on_reset_failure"], ON_RESET_FAILURE, "on_reset_failure"))
    if "drain_deadline_s" in doc:
        p = replace(p, drain_deadline_s=_int(doc["drain_deadline_s"], "drain_deadline_s", 1, MAX_WINDOW_S))
    if "repeat_window_s" in doc:
        p = replace(p, repeat_window_s=_int(doc["repeat_window_s"], "repeat_window_s", 1, MAX_WINDOW_S))
    if "flap_window_s" in doc:
        p = replace(p, flap_window_s=_int(doc["flap_window_s"], "flap_window_s", 0, MAX_WINDOW_S))
    if "limits" in doc:
        p = replace(p, limits=_limits(doc["limits"]))
    if "preapprove" in doc:
        p = replace(p, preapprove=pre.entries(doc["preapprove"]))
    return p


def _known(doc: Mapping[str, Any], keys: frozenset[str], what: str) -> None:
    unknown = sorted(set(doc) - keys)
    if unknown:
        raise UsageError(f"{what} has an unknown key {unknown[0]!r}; its keys are {', '.join(sorted(keys))}")


def _bool(v: object, key: str) -> bool:
    if not isinstance(v, bool):
        raise UsageError(f"{key} must be true or false, not {json.dumps(v)[:40]}")
    return v


def _int(v: object, key: str, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise UsageError(f"{key} must be a whole number from {lo:,} to {hi:,}, not {json.dumps(v)[:40]}")
    return v


def _choice(v: object, choices: tuple[str, ...], key: str) -> str:
    if v not in choices:
        raise UsageError(f"{key} must be one of {', '.join(choices)}, not {json.dumps(v)[:40]}")
    return str(v)


def _match(v: object, where: str) -> str:
    if isinstance(v, str) and (
        v in MATCHES or v in NODE_MATCHES or (v.startswith("xid:") and v[4:].isdigit() and 0 < int(v[4:]) < 100_000)
    ):
        return v
    raise UsageError(
        f"{where}: match must be xid:N, xid:* or one of {', '.join(MATCHES[:-1] + NODE_MATCHES)},"
        f" not {json.dumps(v)[:40]}"
    )


def _rules(v: object) -> tuple[Rule, ...]:
    if not isinstance(v, list):
        raise UsageError("rules must be a list of {match, action} objects")
    if len(v) > MAX_RULES:
        raise UsageError(f"the policy has {len(v)} rules; at most {MAX_RULES}")
    out: list[Rule] = []
    for i, r in enumerate(v, start=1):
        where = f"rule {i}"
        if not isinstance(r, dict):
            raise UsageError(f"{where} must be an object with match and action")
        _known(r, frozenset({"match", "action", "at_least"}), where)
        if "match" not in r or "action" not in r:
            raise UsageError(f"{where} needs both match and action")
        rule = Rule(
            _match(r["match"], where),
            _choice(r["action"], ACTIONS, f"{where}: action"),
            _int(r.get("at_least", 1), f"{where}: at_least", 1, 1_000_000),
        )
        if rule.at_least != 1 and rule.match != "ecc":
            raise UsageError(f"{where}: at_least counts ECC errors; only an ecc rule takes it")
        if rule.match in NODE_MATCHES and rule.action not in NODE_ACTIONS:
            raise UsageError(f"{where}: {rule.match} is a node condition; its action is reboot or none")
        if rule.match not in NODE_MATCHES and rule.action == REBOOT:
            raise UsageError(
                f"{where}: reboot is a node condition's action; a GPU's is reset, reset-when-idle or quarantine"
            )
        out.append(rule)
    return tuple(out)


def _limits(v: object) -> Limits:
    if not isinstance(v, dict):
        raise UsageError("limits must be an object")
    _known(v, _LIMIT_KEYS, "limits")
    lim = Limits()
    if "max_nodes" in v:
        lim = replace(lim, max_nodes=_int(v["max_nodes"], "limits.max_nodes", 1, 10_000))
    if "max_fleet_percent" in v:
        lim = replace(lim, max_fleet_percent=_int(v["max_fleet_percent"], "limits.max_fleet_percent", 1, 100))
    if "max_actions_per_hour" in v:
        lim = replace(
            lim, max_actions_per_hour=_int(v["max_actions_per_hour"], "limits.max_actions_per_hour", 0, 10_000)
        )
    if "per_label" in v:
        label = v["per_label"]
        if (
            not isinstance(label, str)
            or len(label) > 63
            or (label and not label.replace("-", "").replace("_", "").replace(".", "").replace("/", "").isalnum())
        ):
            raise UsageError(f'limits.per_label must be a label key (like rack) or "", not {json.dumps(label)[:40]}')
        lim = replace(lim, per_label=label)
    return lim
