"""agent.instances.rebind: the bundle's parser, the 1 MiB disk with its tar, and the guest's answer."""

from __future__ import annotations

import io
import json
import tarfile

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.instances import rebind

KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\n"
CERT = "ssh-ed25519-cert-v01@openssh.com AAAAIHNzaC1lZDI1NTE5LWNlcnQ= host\n"


def bundle(**over: object) -> bytes:
    doc: dict[str, object] = {"v": 1, "account": "tenant", "principals": ["alloc-1", "restore-2"], **over}
    return json.dumps({k: v for k, v in doc.items() if v is not None}).encode()


def test_a_bundle_with_and_without_a_host_key() -> None:
    assert rebind.parse_bundle(bundle()) == rebind.RebindBundle("tenant", ("alloc-1", "restore-2"))
    full = rebind.parse_bundle(bundle(hostKey=KEY, hostCertificate=CERT))
    assert (full.host_key, full.host_certificate) == (KEY, CERT)


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"not json", "not JSON"),
        (bundle(v=2), "not version 1"),
        (bundle(account="Root;rm"), "account is not a user name"),
        (bundle(principals=[]), "1 to 64"),
        (bundle(principals=["two words"]), "not one printable word"),
        (bundle(hostKey=KEY), "without its certificate"),
        (bundle(hostKey="ssh-rsa AAAA", hostCertificate=CERT), "not a PEM private key"),
        (bundle(hostKey=KEY, hostCertificate="ssh-ed25519 AAAA"), "not an OpenSSH certificate line"),
        (bundle(extra=1), "unknown fields: extra"),
    ],
)
def test_a_bundle_that_is_not_one_is_refused(data: bytes, why: str) -> None:
    with pytest.raises(rebind.RebindError, match=why):
        rebind.parse_bundle(data)


@given(st.binary(max_size=200))
def test_any_bytes_parse_or_raise(data: bytes) -> None:
    try:
        rebind.parse_bundle(data)
    except rebind.RebindError as e:
        assert "\n" not in str(e)


def test_the_disk_is_a_tar_at_offset_0_with_its_last_4_kib_left_for_the_answer() -> None:
    b = rebind.parse_bundle(bundle(hostKey=KEY, hostCertificate=CERT))
    raw = rebind.image(b, "n0nce")
    assert len(raw) == 1 << 20 and raw[-4096:] == b"\0" * 4096
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
        names = {m.name: tar.extractfile(m).read().decode() for m in tar}  # type: ignore[union-attr]
        assert all(m.mode == 0o600 for m in tar.getmembers())
    assert names == {
        "nonce": "n0nce\n", "account": "tenant\n", "principals": "alloc-1\nrestore-2\n", "host_key": KEY,
        "host_key-cert.pub": CERT,
    }  # fmt: skip
    assert rebind.nonce_of(raw) == "n0nce"


def test_only_this_nonce_acknowledges() -> None:
    block = rebind.answer("abc") + b"\0" * 100
    assert rebind.acknowledged(block, "abc")
    assert not rebind.acknowledged(block, "ab")
    assert not rebind.acknowledged(b"\0" * 4096, "abc")
    assert not rebind.acknowledged(b"BCREBOUND abcd\n", "abc")
