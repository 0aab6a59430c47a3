"""Node label rules: Kubernetes' key and value syntax, system keys no operator may touch, one edit."""

from __future__ import annotations

import pytest

from bc.errors import UsageError
from bc.protocol import labels


def test_an_edit_sets_and_removes_in_one_go() -> None:
    out = labels.edit({"pool": "a100", "rack": "r1", "bc.dev/cap.devices.limits": "1"}, {"pool": "h100"}, ["rack"])
    assert out == {"bc.dev/cap.devices.limits": "1", "pool": "h100"}


@pytest.mark.parametrize(
    ("set_", "remove", "error"),
    [
        ({}, [], "nothing to change"),
        ({"pool": "a"}, ["pool"], "both set and removed"),
        ({"-pool": "a"}, [], "bad label key '-pool'"),
        ({"Example.com/x": "a"}, [], "prefix must be a DNS subdomain"),
        ({"pool": "a b"}, [], "bad value 'a b'"),
        ({"pool": "x" * 64}, [], "bad value"),
        ({"bc.dev/cap.devices.limits": "1"}, [], "is the system's"),
        ({}, ["bc.dev/driver.libvirt"], "is the system's"),
        ({f"k{i}": "v" for i in range(65)}, [], "at most 64 labels"),
    ],
)
def test_bad_edits_are_one_sentence(set_: dict[str, str], remove: list[str], error: str) -> None:
    with pytest.raises(UsageError, match=error) as e:
        labels.edit({}, set_, remove)
    assert "\n" not in e.value.message


def test_accepted_keys_and_values() -> None:
    for key in ("pool", "bc.dev/tenant-controlled", "example.com/gpu_model", "a", "A.b-c_d"):
        labels.check_key(key)
    labels.check_value("pool", "")
    labels.check_value("pool", "a100-80gb")


def test_pairs_parse_and_refuse_what_is_not_a_pair() -> None:
    assert labels.parse_pairs(["pool=a100", "empty="]) == {"pool": "a100", "empty": ""}
    with pytest.raises(UsageError, match="not key=value"):
        labels.parse_pairs(["pool"])
    with pytest.raises(UsageError, match="given twice"):
        labels.parse_pairs(["pool=a", "pool=b"])
