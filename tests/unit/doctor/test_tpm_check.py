"""`bc doctor`'s `tpm` check on a node joined with `--attestor tpm`: it asks the TPM itself (through
`TpmNodeKey.check`, as the agent does) and names each failure mode in one sentence. The TPM is faked here at
its edge (the two reads the check makes); tests/integration/test_tpm_swtpm.py runs it against swtpm."""

from __future__ import annotations

import datetime
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from agent.doctor import NodeFiles, check_tpm
from agent.tpm import ANOTHER_AK, CLEARED, HANDLES, Tpm, TpmRecord, TpmUnavailable
from bc.pki.tpm_attest import TpmPublic, ak_uri, spki


class FakeTpm(Tpm):
    """A TPM with an AK and, at `HANDLES[0]`, a node key (or none: a cleared TPM); `down`: nothing answers."""

    def __init__(self, ak: ec.EllipticCurvePublicKey, key: ec.EllipticCurvePublicKey | None, *, down: bool = False):
        super().__init__("swtpm:host=127.0.0.1,port=1")
        self.ak, self.key, self.down = ak, key, down

    async def attestation_key(self) -> ec.EllipticCurvePublicKey:
        if self.down:
            raise TpmUnavailable("the certificate's node key is in the TPM, which is unavailable (no answer)")
        return self.ak

    async def read_public(self, handle: int) -> TpmPublic | None:
        if self.key is None or handle != HANDLES[0]:
            return None
        return TpmPublic(b"", 0x000B, 0, self.key)


def _key() -> ec.EllipticCurvePublicKey:
    return ec.generate_private_key(ec.SECP256R1()).public_key()


def _files(tmp_path: Path, key: ec.EllipticCurvePublicKey, ak: ec.EllipticCurvePublicKey) -> NodeFiles:
    ca_key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "node:n1")]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test CA")]))
        .public_key(key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(hours=24))
        .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(ak_uri(ak))]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    record = TpmRecord(HANDLES[0], spki(key).hex(), ak_uri(ak))
    return NodeFiles(tmp_path, None, record, cert, None)


def test_a_tpm_that_holds_the_key_under_the_named_ak_passes(tmp_path: Path) -> None:
    key, ak = _key(), _key()
    tpm = FakeTpm(ak, key)
    f = check_tpm(_files(tmp_path, key, ak), tpm)
    assert f is not None and f.status == "pass"
    assert f.message == (
        f"the TPM at {tpm.tcti} holds the node key at handle 0x{HANDLES[0]:08x}, and its attestation key is the one"
        " the certificate names"
    )


def test_each_failure_mode_is_its_own_sentence(tmp_path: Path) -> None:
    key, ak = _key(), _key()
    files = _files(tmp_path, key, ak)
    cleared = check_tpm(files, FakeTpm(ak, None))
    assert cleared is not None and (cleared.status, cleared.message) == ("fail", CLEARED)
    other = check_tpm(files, FakeTpm(_key(), key))
    assert other is not None and (other.status, other.message) == ("fail", ANOTHER_AK)
    down = check_tpm(files, FakeTpm(ak, key, down=True))
    assert down is not None and down.status == "fail"
    assert down.message.startswith("the certificate's node key is in the TPM, which is unavailable")
    assert down.fix == "check the TPM at swtpm:host=127.0.0.1,port=1 (bc doctor --tcti names another)"


def test_a_key_in_a_file_has_no_tpm_check(tmp_path: Path) -> None:
    key, ak = _key(), _key()
    files = _files(tmp_path, key, ak)
    assert check_tpm(NodeFiles(tmp_path, None, None, files.cert, None), FakeTpm(ak, key)) is None
