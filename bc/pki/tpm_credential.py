"""TPM2 MakeCredential without a TPM: seal a secret to a TPM's endorsement key (EK) for one of its keys' names.

Credential activation (TPM 2.0 Part 1 §24, "Credential Protection"; Part 3 TPM2_MakeCredential) is how a server
that trusts an EK (its certificate chains to the manufacturer's CA) learns that an attestation key (AK) lives in
the same TPM: it seals a secret that only `TPM2_ActivateCredential` with that EK's private half AND a loaded
object of exactly the AK's name can recover. The node returns the secret; nothing else can produce it.

For an RSA EK (the TCG EK Credential Profile's RSA 2048 template: name algorithm SHA-256, AES-128-CFB):

    seed          = 32 random bytes (the name algorithm's digest size)
    secret_out    = TPM2B( RSA-OAEP(SHA-256, label "IDENTITY\\0") of seed to the EK )
    sym_key       = KDFa(SHA-256, seed, "STORAGE", name, "", 128)
    enc_identity  = AES-128-CFB(sym_key, IV = 0) of TPM2B(credential)
    hmac_key      = KDFa(SHA-256, seed, "INTEGRITY", "", "", 256)
    outer_hmac    = HMAC-SHA-256(hmac_key, enc_identity || name)
    id_object     = TPM2B( TPM2B(outer_hmac) || enc_identity )

KDFa is SP 800-108's counter-mode KDF with HMAC (Part 1 §11.4.10.2): HMAC(key, counter(4) || label || 0x00 ||
contextU || contextV || bits(4)) for counter 1, 2, …, cut to `bits`. Pure: no I/O, the seed passed in (RSA-OAEP's
own padding randomness is `cryptography`'s). ECC EKs (an ECDH seed) are not taken: an RSA 2048 EK certificate is
the one every TPM 2.0 carries (docs/node-security.md).
"""

from __future__ import annotations

import hashlib
import hmac
import struct

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

SEED_BYTES = 32
SYM_KEY_BITS = 128
MAX_CREDENTIAL = 32
"""The credential a server seals: at most the name algorithm's digest size (TPM2B_DIGEST)."""
IDENTITY_LABEL = b"IDENTITY\0"


def tpm2b(data: bytes) -> bytes:
    return struct.pack(">H", len(data)) + data


def kdfa(key: bytes, label: bytes, context_u: bytes, context_v: bytes, bits: int) -> bytes:
    """KDFa with HMAC-SHA-256 (`label` without its terminating NUL: it is added here, as the TPM does)."""
    out, counter = b"", 0
    while len(out) * 8 < bits:
        counter += 1
        data = struct.pack(">I", counter) + label + b"\0" + context_u + context_v + struct.pack(">I", bits)
        out += hmac.new(key, data, hashlib.sha256).digest()
    return out[: (bits + 7) // 8]


def aes_cfb(key: bytes, data: bytes, *, decrypt: bool = False) -> bytes:
    """AES in CFB-128 mode with a zero IV, as the TPM's credential protection uses it (built on the block cipher:
    `cryptography` moved its CFB mode to its decrepit modules)."""
    block = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
    out, feedback = bytearray(), bytes(16)
    for i in range(0, len(data), 16):
        chunk = data[i : i + 16]
        stream = block.update(feedback)
        done = bytes(a ^ b for a, b in zip(chunk, stream, strict=False))
        out += done
        feedback = chunk if decrypt else done
    return bytes(out)


def protect(seed: bytes, name: bytes, credential: bytes) -> bytes:
    """The TPM2B_ID_OBJECT: `credential` encrypted under `seed` for the object `name`, with its outer HMAC."""
    if not 0 < len(credential) <= MAX_CREDENTIAL:
        raise ValueError(f"a credential is 1 to {MAX_CREDENTIAL} bytes, not {len(credential)}")
    sym_key = kdfa(seed, b"STORAGE", name, b"", SYM_KEY_BITS)
    enc_identity = aes_cfb(sym_key, tpm2b(credential))
    hmac_key = kdfa(seed, b"INTEGRITY", b"", b"", 256)
    outer = hmac.new(hmac_key, enc_identity + name, hashlib.sha256).digest()
    return tpm2b(tpm2b(outer) + enc_identity)


def seal_seed(ek: rsa.RSAPublicKey, seed: bytes) -> bytes:
    """The TPM2B_ENCRYPTED_SECRET: `seed` encrypted to the EK, RSA-OAEP with SHA-256 and the label IDENTITY."""
    oaep = padding.OAEP(mgf=padding.MGF1(hashes.SHA256()), algorithm=hashes.SHA256(), label=IDENTITY_LABEL)
    return tpm2b(ek.encrypt(seed, oaep))


def make_credential(ek: rsa.RSAPublicKey, name: bytes, credential: bytes, seed: bytes) -> tuple[bytes, bytes]:
    """(TPM2B_ID_OBJECT, TPM2B_ENCRYPTED_SECRET): what `TPM2_ActivateCredential` with `ek` and the object called
    `name` (its name algorithm, then the digest of its public area) turns back into `credential`."""
    if len(seed) != SEED_BYTES:
        raise ValueError(f"the seed is {SEED_BYTES} bytes, not {len(seed)}")
    return protect(seed, name, credential), seal_seed(ek, seed)
