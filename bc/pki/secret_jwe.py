"""A secret in flight: the node's signed request, and the JWE the broker answers it with.

The node makes a P-256 key for each request (`OneTimeKey`), puts its public JWK in the request body and
signs the body with its node key (`request_message`: domain-separated like `bc.pki.attest`). The broker
checks that signature against the node's certificates, so a gateway cannot ask in a node's name or swap
in a key of its own, and answers with a compact JWE (ECDH-ES key agreement, A256GCM content encryption,
RFC 7518) to that public key. Its protected header names the secret, the version and the request id,
authenticated with the content: the node refuses an answer for another request or another secret. The
private half lives in the node's memory for one request and is dropped with it, so a recorded answer is
useless later.

joserfc does the JOSE; this module fixes the algorithms (no `alg` negotiation: a header naming any other
algorithm is refused before decryption).
"""

from __future__ import annotations

import json

from joserfc import jwe
from joserfc.errors import JoseError
from joserfc.jwk import ECKey
from joserfc.registry import HeaderParameter

ALG = "ECDH-ES"
ENC = "A256GCM"
CURVE = "P-256"
REQUEST_PURPOSE = b"bc.v1/secret-request\n"


REGISTRY = jwe.JWERegistry(
    header_registry={
        "bc.name": HeaderParameter("the secret's name", "str", required=True),
        "bc.ver": HeaderParameter("the secret's version", "int", required=True),
        "bc.rid": HeaderParameter("the request this answers", "str", required=True),
    },
    algorithms=[ALG, ENC],
)
"""ECDH-ES and A256GCM only, and our three header parameters (joserfc refuses unknown ones)."""


class BadSecretAnswer(ValueError):
    """An answer that does not open with this request's key, or is not for this request."""


def request_message(body: bytes) -> bytes:
    """What the node key signs for a SecretRequest."""
    return REQUEST_PURPOSE + body


class OneTimeKey:
    """One request's key pair; the private half never leaves this object."""

    def __init__(self) -> None:
        self._key = ECKey.generate_key(CURVE, private=True)  # from the OS CSPRNG (cryptography)

    @property
    def public_jwk(self) -> str:
        return json.dumps(self._key.as_dict(private=False), sort_keys=True, separators=(",", ":"))

    def open(self, token: str, *, name: str, request_id: str) -> tuple[bytes, int]:
        """The plaintext and version of an answer to this request for `name`; BadSecretAnswer otherwise."""
        try:
            obj = jwe.decrypt_compact(token, self._key, registry=REGISTRY)
        except (JoseError, ValueError) as e:
            raise BadSecretAnswer(f"the answer does not open with this request's key ({type(e).__name__})") from None
        header = obj.protected
        if header.get("alg") != ALG or header.get("enc") != ENC:
            raise BadSecretAnswer(f"the answer uses {header.get('alg')}/{header.get('enc')}, not {ALG}/{ENC}")
        if header.get("bc.name") != name or header.get("bc.rid") != request_id:
            raise BadSecretAnswer("the answer is for another request")
        version = header.get("bc.ver")
        if not isinstance(version, int) or obj.plaintext is None:
            raise BadSecretAnswer("the answer carries no version")
        return obj.plaintext, version


def parse_public_jwk(text: str) -> ECKey:
    """The request's public key, or ValueError with why (a private key, another curve, not JSON)."""
    try:
        data = json.loads(text)
    except ValueError:
        raise ValueError("the request's public key is not JSON") from None
    if not isinstance(data, dict) or data.get("kty") != "EC" or data.get("crv") != CURVE or "d" in data:
        raise ValueError(f"the request's key must be a public {CURVE} JWK")
    try:
        return ECKey.import_key(data)
    except (JoseError, ValueError) as e:
        raise ValueError(f"the request's public key does not import ({type(e).__name__})") from None


def seal_answer(public_jwk: str, value: bytes, *, name: str, version: int, request_id: str) -> str:
    """A compact JWE of `value` to the request's public key (ValueError if that key is unusable)."""
    key = parse_public_jwk(public_jwk)
    header = {"alg": ALG, "enc": ENC, "bc.name": name, "bc.ver": version, "bc.rid": request_id}
    return jwe.encrypt_compact(header, value, key, registry=REGISTRY)
