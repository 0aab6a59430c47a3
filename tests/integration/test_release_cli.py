"""`bc release` through the real CLI against a real `bc serve` (the lab of test_quorum_cli: n1 and n2 joined,
no release server): keys, publish with --url, status, rollout's refusals; bad input is one sentence, a
non-zero exit and nothing stored. `bc release RESERVATION` keeps giving reservations back (test_capacity_cli)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bc.pki import releases
from tests.integration.test_cli_cmd import bc, ok_json
from tests.integration.test_quorum_cli import Lab, refused, running_lab


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Lab]:
    yield from running_lab(tmp_path, monkeypatch)


def test_keys_publish_status_and_rollout(lab: Lab, tmp_path: Path) -> None:
    key = tmp_path / "release.key"
    info = ok_json("release", "key", "add", "--key", str(key), "--generate")
    assert info["key_id"] == releases.key_id(releases.load_public(key))
    assert key.stat().st_mode & 0o777 == 0o600

    binary = tmp_path / "bc-1.4.0-linux-x86_64"
    binary.write_bytes(b"\x7fELF" + b"x" * 4000)
    url = "https://mirror.lab.example/bc-1.4.0"
    rel = ok_json("release", "publish", str(binary), "--key", str(key), "--url", url)
    assert (rel["version"], rel["sequence"], rel["url"], rel["size"]) == ("1.4.0", 1, url, 4004)
    assert (rel["name"], rel["platform"]) == ("bc", "linux-x86_64")  # from the file's name, both signed

    # Bad input: one sentence each, nothing stored.
    other = tmp_path / "other.key"
    releases.generate_key(other)
    refused(bc("release", "publish", str(binary), "--key", str(key), "--url", url), 4, "already published")
    v2 = tmp_path / "bc-1.5.0-linux-x86_64"
    v2.write_bytes(b"y" * 10)
    refused(bc("release", "publish", str(v2), "--key", str(other), "--url", url), 2, "does not verify")
    refused(bc("release", "publish", str(v2), "--key", str(key), "--url", "http://m/x"), 2, "not an https:// URL")
    refused(bc("release", "publish", str(v2), "--key", str(key)), 2, "does not serve releases")
    odd = tmp_path / "mybuild"
    odd.write_bytes(b"z")
    refused(bc("release", "publish", str(odd), "--key", str(key), "--url", url), 2, "cannot tell the version")
    odd_v = ("release", "publish", str(odd), "--key", str(key), "--url", url, "--version", "2.0")
    refused(bc(*odd_v), 2, "cannot tell the platform")
    refused(bc(*odd_v, "--platform", "Linux x86"), 2, "not a release platform")
    junk = tmp_path / "junk.pem"
    junk.write_text("not a key")
    refused(bc("release", "key", "add", "--key", str(junk)), 2, "neither an Ed25519 private nor public PEM key")
    refused(bc("release", "key", "add", "--key", str(key), "--generate"), 2, "never overwritten")

    status = ok_json("release", "status")
    assert [r["version"] for r in status["releases"]] == ["1.4.0"]
    assert [k["key_id"] for k in status["keys"]] == [info["key_id"]]
    text = bc("release", "status")
    assert text.exit_code == 0 and "1.4.0" in text.stdout and "SEQ" in text.stdout

    refused(bc("release", "rollout", "9.9.9", "--nodes", "n1"), 3, "no release '9.9.9'")
    refused(bc("release", "rollout", "1.4.0", "--nodes", "n1,nope"), 3, "no node named 'nope'")
    refused(bc("release", "rollout", "1.4.0", "--nodes", "n1,,n2"), 2, "comma-separated")
    job = ok_json("release", "rollout", "1.4.0", "--nodes", "n1,n2", "--max-unavailable", "2", "--no-wait")
    assert job["template"] == "release" and job["subjects"] == ["n1", "n2"], job
