"""Exec tickets: short-lived JWS tokens that authorise one tunnel (docs/access.md).

The control plane signs a ticket (`issue`) for one operator (`sub`), one node (`aud`), one tunnel id
(`sid`), one purpose (`shell`, `exec` or `forward`) with its port, for at most `MAX_TTL_S`; the node checks
it (`verify`) against the JWKS pinned in its signed `access` section, with its own node id and the sid of
the tunnel it is asked to open. Whether the `jti` was used already is the journal's question
(`agent.journal_tickets`): this module is pure, over joserfc (JWS, RFC 7515; alg `Ed25519`, RFC 9864).

A refusal is a `TicketRefused` whose `reason` is a code both ends compare:

| reason        | when |
|---------------|------|
| `bad-ticket`  | not a compact JWS, a wrong alg, a bad signature, a missing or malformed claim |
| `unknown-key` | its `kid` is not in the node's JWKS (a rotated key, or none pinned) |
| `wrong-node`  | `aud` is another node |
| `wrong-sid`   | `sid` is not the tunnel the node is asked to open |
| `expired`     | `exp` has passed (no leeway: the node reads server time) |
| `too-long`    | `exp - iat` is over `MAX_TTL_S`, or `iat` is in the future |
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet, OKPKey

from bc.errors import TicketRefused, UsageError

ALG = "Ed25519"
ISSUER = "bc"
MAX_TTL_S = 300
DEFAULT_TTL_S = 60
FUTURE_IAT_S = 60
"""How far in the future `iat` may be (the node's reading of server time lags by a round trip)."""

PURPOSES = ("shell", "exec", "forward")
SSH_PORT = 22


@dataclass(frozen=True)
class Ticket:
    jti: str
    sid: str
    node_id: str
    operator: str
    purpose: str
    port: int
    iat_s: int
    exp_s: int
    kid: str
    record: bool = False
    """The `rec` claim: the operator's client promised a typescript of this shell (docs/access.md)."""

    @property
    def exp_ms(self) -> int:
        return self.exp_s * 1000


def check_request(purpose: str, port: int, reason: str, ttl_s: int) -> tuple[int, int]:
    """The port and TTL a request stands for, or a UsageError naming what is wrong (nothing is issued)."""
    if purpose not in PURPOSES:
        raise UsageError(f"the purpose {purpose[:32]!r} is not one of {', '.join(PURPOSES)}")
    if purpose in ("shell", "exec"):
        port = port or SSH_PORT
    if not 1 <= port <= 65535:
        raise UsageError(f"the port {port} is not between 1 and 65535")
    if purpose == "shell" and not reason.strip():
        raise UsageError("a shell needs a reason: pass --reason TEXT (it is recorded with the session)")
    ttl = ttl_s or DEFAULT_TTL_S
    if not 1 <= ttl <= MAX_TTL_S:
        raise UsageError(f"a ticket lives at most {MAX_TTL_S} s, not {ttl_s}")
    return port, ttl


# -- keys ---------------------------------------------------------------------------------------------


def new_key(kid: str, private: Ed25519PrivateKey) -> OKPKey:
    """The signing key `private` (fresh secret material, from the injected `Secrets`) named `kid`."""
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return OKPKey.import_key(pem, {"kid": kid})


def key_to_json(key: OKPKey) -> str:
    return json.dumps(key.as_dict(private=True), sort_keys=True)


def key_from_json(text: str) -> OKPKey:
    key = OKPKey.import_key(json.loads(text))
    if not key.is_private or key.kid is None:
        raise UsageError("the exec-ticket key file does not hold a named private Ed25519 key")
    return key


def public_jwk(key: OKPKey) -> dict[str, Any]:
    return {**key.as_dict(private=False), "alg": ALG, "use": "sig"}


def jwks_json(public_keys: list[dict[str, Any]]) -> str:
    """The key set a node pins, as canonical JSON (sorted keys, by kid): the same keys make the same text."""
    keys = sorted(public_keys, key=lambda k: str(k.get("kid", "")))
    return json.dumps({"keys": keys}, sort_keys=True, separators=(",", ":"))


def kids_of(jwks: str) -> frozenset[str]:
    """The kids of a pinned JWKS (empty when it is empty or unreadable)."""
    try:
        return frozenset(str(k["kid"]) for k in json.loads(jwks)["keys"] if "kid" in k)
    except (ValueError, KeyError, TypeError):
        return frozenset()


# -- tickets ------------------------------------------------------------------------------------------


def issue(key: OKPKey, t: Ticket) -> str:
    """The compact JWS of `t`, signed by `key` (whose kid `t.kid` must be)."""
    if key.kid != t.kid:
        raise UsageError(f"ticket kid {t.kid!r} is not the signing key's {key.kid!r}")
    claims = {
        "iss": ISSUER,
        "sub": t.operator,
        "aud": t.node_id,
        "sid": t.sid,
        "jti": t.jti,
        "purpose": t.purpose,
        "port": t.port,
        "iat": t.iat_s,
        "exp": t.exp_s,
    }
    if t.record:
        claims["rec"] = True
    return jwt.encode({"alg": ALG, "kid": t.kid, "typ": "bc-exec+jwt"}, claims, key, algorithms=[ALG])


def peek(token: str) -> Ticket:
    """The claims of `token` UNVERIFIED (which node and sid it names, to verify it for them): never trust it."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        header = token.split(".")[0]
        kid = json.loads(base64.urlsafe_b64decode(header + "=" * (-len(header) % 4))).get("kid", "")
    except (IndexError, ValueError, TypeError, AttributeError):
        raise TicketRefused("bad-ticket", "the ticket is not a compact JWS") from None
    if not isinstance(claims, dict):
        raise TicketRefused("bad-ticket", "the ticket's claims are not an object")
    return Ticket(
        jti=_str(claims, "jti"),
        sid=_str(claims, "sid"),
        node_id=_str(claims, "aud"),
        operator=_str(claims, "sub"),
        purpose=_str(claims, "purpose"),
        port=_int(claims, "port"),
        iat_s=_int(claims, "iat"),
        exp_s=_int(claims, "exp"),
        kid=str(kid),
        record=claims.get("rec") is True,
    )


def _keyset(jwks: str) -> KeySet:
    try:
        return KeySet.import_key_set(json.loads(jwks))
    except (ValueError, KeyError, TypeError, JoseError):
        raise TicketRefused("unknown-key", "this node holds no usable exec-ticket key set") from None


def _str(claims: dict[str, Any], name: str) -> str:
    v = claims.get(name)
    if not isinstance(v, str) or not v or len(v) > 256:
        raise TicketRefused("bad-ticket", f"the ticket's {name!r} claim is missing or not a short string")
    return v


def _int(claims: dict[str, Any], name: str) -> int:
    v = claims.get(name)
    if not isinstance(v, int) or isinstance(v, bool):
        raise TicketRefused("bad-ticket", f"the ticket's {name!r} claim is missing or not a number")
    return v


def verify(token: str, jwks: str, *, node_id: str, sid: str, now_ms: int) -> Ticket:
    """The ticket in `token` if it holds for opening tunnel `sid` on `node_id` at `now_ms`; else TicketRefused."""
    if not jwks:
        raise TicketRefused("unknown-key", "this node has no exec-ticket key set in its access section")
    keys = _keyset(jwks)
    try:
        tok = jwt.decode(token, keys, algorithms=[ALG])
    except JoseError as e:
        reason = "unknown-key" if "key" in type(e).__name__.lower() else "bad-ticket"
        raise TicketRefused(reason, f"the ticket does not verify against this node's key set ({e.error})") from None
    except (ValueError, TypeError):
        raise TicketRefused("bad-ticket", "the ticket is not a compact JWS") from None
    if tok.header.get("alg") != ALG:
        raise TicketRefused("bad-ticket", f"the ticket's alg must be {ALG}")
    kid = tok.header.get("kid")
    if not isinstance(kid, str) or kid not in kids_of(jwks):
        raise TicketRefused("unknown-key", "the ticket's key is not in this node's key set")
    c = tok.claims
    if c.get("iss") != ISSUER:
        raise TicketRefused("bad-ticket", "the ticket was not issued by bc")
    t = Ticket(
        jti=_str(c, "jti"),
        sid=_str(c, "sid"),
        node_id=_str(c, "aud"),
        operator=_str(c, "sub"),
        purpose=_str(c, "purpose"),
        port=_int(c, "port"),
        iat_s=_int(c, "iat"),
        exp_s=_int(c, "exp"),
        kid=kid,
        record=c.get("rec") is True,
    )
    if t.purpose not in PURPOSES or not 1 <= t.port <= 65535:
        raise TicketRefused("bad-ticket", "the ticket's purpose or port is not one bc issues")
    if t.node_id != node_id:
        raise TicketRefused("wrong-node", f"the ticket is for node {t.node_id!r}, not this one ({node_id})")
    if t.sid != sid:
        raise TicketRefused("wrong-sid", f"the ticket is for tunnel {t.sid!r}, not {sid!r}")
    if t.exp_s - t.iat_s > MAX_TTL_S or t.iat_s * 1000 > now_ms + FUTURE_IAT_S * 1000:
        raise TicketRefused("too-long", f"the ticket lives over {MAX_TTL_S} s or starts in the future")
    if t.exp_s * 1000 <= now_ms:
        raise TicketRefused("expired", "the ticket has expired")
    return t
