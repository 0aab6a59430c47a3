"""The checks a spec section passes before it is stored (`bc.protocol.spec_validation`)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bc.protocol import canonical
from bc.protocol.canonical import SpecError
from bc.protocol.spec_validation import MAX_JSON_DEPTH, check_section
from bc.protocol.text_safety import unsafe_char


def check(section: str, doc: object) -> None:
    check_section(section, canonical.section_from_json(section, json.dumps(doc)))


def refused(section: str, doc: object) -> str:
    with pytest.raises(SpecError) as e:
        check(section, doc)
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"the {section} section's "), message
    return message


GOOD = {
    "host": {"units": [{"name": "sysctl", "settings_json": '{"vm.swappiness": 1}'}, {"name": "kernel-modules"}]},
    "instances": {
        "instances": [
            {"id": "vm-1", "runtime": "qemu", "vcpus": 1, "memory_mib": 256, "kernel": "vmlinuz", "state": "PAUSED"}
        ]
    },
    "access": {
        "principals": ["oncall", "root@n1"],
        "revoked_serials": ["12", "4097"],
        "ssh_ca_keys": ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICgSvCEPeeLHJiWeXDoCuN5bdn6mpHrcxSLMYt/aGFcW ca"],
    },
    "telemetry": {
        "otlp_endpoint": "http://127.0.0.1:4317",
        "export_interval_s": 30,
        "resource_attributes": {"rack": "r1"},
    },
    "daemon": {
        "name": "bc",
        "version": "1.4.0",
        "url": "https://rel.example/bc",
        "sha256": "a" * 64,
        "sequence": 7,
        "platform": "linux-x86_64",
    },
    "site": {"cache_images": [{"url": "https://img.example/u.qcow2", "sha256": "b" * 64, "format": "qcow2"}]},
}


@pytest.mark.parametrize("section", sorted(GOOD))
def test_ordinary_sections_pass(section: str) -> None:
    check(section, GOOD[section])


@pytest.mark.parametrize(
    "name",
    ["../../etc/passwd", "/etc/sysctl.d/x", "sysctl\n", "Sysctl", "", "a" * 64, "sys ctl", "-x", "sysctl;rm"],
)
def test_a_unit_name_is_a_name_not_a_path(name: str) -> None:
    assert "is not a unit name" in refused("host", {"units": [{"name": name}]}) or "U+" in refused(
        "host", {"units": [{"name": name}]}
    )


def test_a_trailing_newline_is_not_a_name() -> None:
    # `re.match(r"^...$")` accepted this once; fullmatch does not.
    assert "U+000A" in refused("host", {"units": [{"name": "sysctl\n"}]})
    assert "is not a principal" in refused("access", {"principals": ["oncall\u00e9"]})


@pytest.mark.parametrize(
    "settings, why",
    [
        ("not json", "is not JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('"text"', "must be a JSON object"),
        ('{"a": "\\u001b[2J"}', "U+001B"),
        ('{"\\u202e": 1}', "U+202E"),
        ("[" * 100_000, "nests deeper"),
        ('{"a":' * (MAX_JSON_DEPTH + 2) + "1" + "}" * (MAX_JSON_DEPTH + 2), "nests deeper"),
    ],
)
def test_settings_json_is_a_plain_json_object(settings: str, why: str) -> None:
    message = refused("host", {"units": [{"name": "sysctl", "settings_json": settings}]})
    assert why in message and "settings_json" in message


def test_a_unit_appears_once() -> None:
    assert "appears twice" in refused("host", {"units": [{"name": "sysctl"}, {"name": "sysctl"}]})


@pytest.mark.parametrize(
    "section, doc",
    [
        ("telemetry", {"otlp_endpoint": "http://[::1/x"}),
        ("telemetry", {"otlp_endpoint": "http://h:99999/"}),
        ("telemetry", {"otlp_endpoint": "file:///etc/passwd"}),
        ("telemetry", {"otlp_endpoint": "http://"}),
        ("telemetry", {"export_interval_s": -1}),
        ("telemetry", {"export_interval_s": 86_401}),
        ("daemon", {"sha256": "xyz"}),
        ("daemon", {"url": "ftp://rel.example/bc"}),
        ("daemon", {"version": "1.0 ; reboot"}),
        ("daemon", {"name": "bc\nversion=9"}),
        ("daemon", {"platform": "linux-x86_64\nsha256=0"}),
        ("site", {"cache_images": [{"url": "https://i/x", "sha256": "A" * 64}]}),
        ("instances", {"instances": [{"id": "a/../b"}]}),
        ("instances", {"instances": [{"id": "a"}, {"id": "a"}]}),
        ("access", {"revoked_serials": ["12-34"]}),
        ("access", {"ssh_ca_keys": ["justonetoken"]}),
    ],
)
def test_urls_digests_ranges_and_ids(section: str, doc: object) -> None:
    refused(section, doc)


BAD_CHARS = ["\x00", "\x07", "\x1b", "\x7f", "\x85", "\x9b", "\u202e", "\u2066", "\u200f", "\u2028", "\r", "\n"]


@pytest.mark.parametrize("ch", BAD_CHARS)
@pytest.mark.parametrize(
    "section, make",
    [
        ("telemetry", lambda s: {"resource_attributes": {"rack": s}}),
        ("telemetry", lambda s: {"resource_attributes": {s: "r1"}}),
        ("instances", lambda s: {"instances": [{"id": "vm", "image": s}]}),
        ("access", lambda s: {"exec_ticket_jwks": s}),
        ("site", lambda s: {"boot_lease_state": s}),
    ],
)
def test_no_control_or_bidi_character_anywhere(section: str, make: object, ch: str) -> None:
    doc = make(f"a{ch}b")  # type: ignore[operator]
    assert f"U+{ord(ch):04X}" in refused(section, doc)


BIDI_AND_SEPARATORS = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u2028\u2029"


@given(st.text())
def test_unsafe_char_finds_exactly_the_forbidden_characters(text: str) -> None:
    import unicodedata

    bad = [
        c
        for c in text
        if unicodedata.category(c) == "Cc"
        or c in "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u2028\u2029"
    ]
    assert unsafe_char(text) == (bad[0] if bad else None)


@given(st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp", "Cf"))))
def test_printable_text_passes_where_free_text_is_allowed(text: str) -> None:
    check("telemetry", {"resource_attributes": {"note": text}})
