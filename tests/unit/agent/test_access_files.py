"""The access section's rules as pure functions: what becomes a file, and what is refused whole.

The property: whatever text a section holds, either it is refused (`InvalidAccess`) or every file it
makes has exactly one line per CA key or principal, so no value can add a line to sshd's files.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.converge import access_files as af
from bc.protocol import ssh_lines
from bc.protocol.pb import spec_pb2

NODE = "n3"
SSH = Path("/etc/ssh/bc")
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICgSvCEPeeLHJiWeXDoCuN5bdn6mpHrcxSLMYt/aGFcW"

_piece = st.sampled_from([*"abcAZ09_.-@ ,\t\n\r\x00\x1b\u2028\u202e", "n3", "@n3", "root", "oncall@n3"])
hostile = st.lists(_piece, max_size=6).map("".join)


def body_lines(data: bytes) -> list[str]:
    return [ln for ln in data.decode().splitlines() if not ln.startswith("#")]


@given(principals=st.lists(hostile, max_size=5), keys=st.lists(st.one_of(hostile, st.just(KEY)), max_size=3))
def test_either_refused_or_one_line_per_value(principals: list[str], keys: list[str]) -> None:
    section = spec_pb2.AccessSection(principals=principals, ssh_ca_keys=keys, revoked_serials=["1"])
    try:
        files = af.desired(section, NODE, SSH)
    except af.InvalidAccess as e:
        assert "\n" not in str(e)
        return
    assert body_lines(files.files[af.CA_FILE]) == [" ".join(k.split()[:2]) for k in keys]
    own = sorted({p for p in principals if ssh_lines.own_user(p, NODE) is not None})
    written = sorted(
        line
        for rel, data in files.files.items()
        if rel.startswith(af.PRINCIPALS_DIR + "/")
        for line in body_lines(data)
    )
    assert written == own
    for rel, data in files.files.items():
        if rel.startswith(af.PRINCIPALS_DIR + "/"):
            user = rel.split("/", 1)[1]
            assert all(line == f"{user}@{NODE}" for line in body_lines(data))


@pytest.mark.parametrize(
    ("principal", "fragment"),
    [
        ("on call@n3", "whitespace"),
        ("a,b@n3", "comma"),
        ("x\x00@n3", r"U\+0000"),
        ("x\u202e@n3", r"U\+202E"),
        ("", "not a"),
    ],
)
def test_a_principal_that_could_add_a_line_refuses_the_section(principal: str, fragment: str) -> None:
    with pytest.raises(af.InvalidAccess, match=fragment):
        af.desired(spec_pb2.AccessSection(principals=[principal]), NODE, SSH)


@pytest.mark.parametrize(
    ("key", "fragment"),
    [
        (f"{KEY} {KEY}", "more than one key"),
        (f"{KEY}\nssh-rsa AAAA", r"U\+000A"),
        ("ssh-ed25519", "type and key"),
        ("ssh-ed25519 !!!!", "base64"),
        ("ssh-rsa AAAAC3NzaC1lZDI1NTE5AAAAICgSvCEPeeLHJiWeXDoCuN5bdn6mpHrcxSLMYt/aGFcW", "not ssh-rsa"),
        ("ssh-ed25519-cert-v01@openssh.com AAAA", "key type"),
    ],
)
def test_a_ca_key_that_is_not_exactly_one_key_refuses_the_section(key: str, fragment: str) -> None:
    with pytest.raises(af.InvalidAccess, match=fragment):
        af.desired(spec_pb2.AccessSection(ssh_ca_keys=[key]), NODE, SSH)


def test_only_this_nodes_principals_each_under_its_user() -> None:
    section = spec_pb2.AccessSection(
        ssh_ca_keys=[KEY + " comment"], principals=["oncall@n3", "oncall@n4", "ops", "root@n3", "oncall@n3"]
    )
    files = af.desired(section, NODE, SSH)
    assert sorted(files.files) == ["ca.pub", "principals/oncall", "principals/root", "sshd.conf"]
    assert body_lines(files.files["principals/oncall"]) == ["oncall@n3"]
    assert body_lines(files.files["ca.pub"]) == [KEY]  # the comment is not written
    assert body_lines(files.files["sshd.conf"]) == [
        "TrustedUserCAKeys /etc/ssh/bc/ca.pub",
        "AuthorizedPrincipalsFile /etc/ssh/bc/principals/%u",
        "RevokedKeys /etc/ssh/bc/revoked.krl",
    ]


def test_serials_are_decimal_and_sorted_once_each() -> None:
    files = af.desired(spec_pb2.AccessSection(ssh_ca_keys=[KEY], revoked_serials=["9", "5", "9"]), NODE, SSH)
    assert files.serials == (5, 9) and files.krl_spec() == b"serial: 5\nserial: 9\n"
    for bad in ("0", "0x10", "-1", str(1 << 64), "１"):
        with pytest.raises(af.InvalidAccess, match="not a certificate serial"):
            af.desired(spec_pb2.AccessSection(revoked_serials=[bad]), NODE, SSH)


def test_an_empty_section_makes_no_files_and_principals_of_other_nodes_alone_make_none() -> None:
    assert af.desired(spec_pb2.AccessSection(), NODE, SSH).empty
    assert af.desired(spec_pb2.AccessSection(principals=["oncall@n4"]), NODE, SSH).empty


@pytest.mark.parametrize("bad", ["relative/ssh", "/etc/ssh b", "/etc/ssh#", "/etc/%u", '/etc/"x'])
def test_an_ssh_dir_sshd_would_misread_is_refused(bad: str) -> None:
    with pytest.raises(af.InvalidAccess, match="SSH directory"):
        af.desired(spec_pb2.AccessSection(ssh_ca_keys=[KEY]), NODE, Path(bad))


def test_managed_paths_are_ours_only() -> None:
    found = ["ca.pub", "revoked.krl", "revoked.krl.src", "sshd.conf", "principals/root", "other", "principals/a/b"]
    assert af.managed(found) == ["ca.pub", "principals/root", "revoked.krl", "revoked.krl.src", "sshd.conf"]
