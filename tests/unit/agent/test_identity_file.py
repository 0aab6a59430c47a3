"""identity.json that is damaged or edited by hand: one sentence, exit 2, and the file left alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.identity import Identity
from bc.errors import UsageError

GOOD = {
    "node_id": "n1",
    "role": "node",
    "server": "127.0.0.1:7443",
    "identity_generation": 1,
    "ca_fingerprint": "sha256:" + "0" * 64,
}


def load_refused(tmp_path: Path, raw: bytes) -> str:
    (tmp_path / "identity.json").write_bytes(raw)
    with pytest.raises(UsageError) as e:
        Identity.load(tmp_path)
    assert (tmp_path / "identity.json").read_bytes() == raw  # refused, never rewritten
    message = e.value.message
    assert "\n" not in message and "bc join --reset" in message, message
    assert "Error" not in message and "__init__" not in message, message
    return message


def test_a_good_identity_loads(tmp_path: Path) -> None:
    (tmp_path / "identity.json").write_text(json.dumps(GOOD))
    assert Identity.load(tmp_path).node_id == "n1"


@pytest.mark.parametrize("field", sorted(GOOD))
def test_a_missing_field_is_named(tmp_path: Path, field: str) -> None:
    doc = {k: v for k, v in GOOD.items() if k != field}
    assert f"lacks {field}" in load_refused(tmp_path, json.dumps(doc).encode())


@pytest.mark.parametrize(
    "raw, says",
    [
        (b"\xff\xfe not utf-8", "not UTF-8"),
        (b"{", "not JSON"),
        (b"[" * 100_000, "unreadable"),
        (b"[1, 2]", "not a JSON object"),
        (json.dumps({**GOOD, "node_id": 5}).encode(), "node_id that is not a string"),
        (json.dumps({**GOOD, "identity_generation": "1"}).encode(), "identity_generation that is not an integer"),
        (json.dumps({**GOOD, "identity_generation": True}).encode(), "identity_generation that is not an integer"),
        (json.dumps({**GOOD, "extra": 1}).encode(), "unknown fields extra"),
        (json.dumps({**GOOD, "files": {"key": "node.key"}}).encode(), "names its key, cert and ca files wrongly"),
        (
            json.dumps({**GOOD, "files": {"key": "../k", "cert": "c", "ca": "a"}}).encode(),
            "names its key, cert and ca files wrongly",
        ),
    ],
)
def test_damage_is_one_sentence(tmp_path: Path, raw: bytes, says: str) -> None:
    assert says in load_refused(tmp_path, raw)
