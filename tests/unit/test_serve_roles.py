"""Keys follow roles (bc.assembly.roles): every subset of api,gateway,worker, what it reads and which flags it takes."""

from __future__ import annotations

import pytest

from bc.assembly.roles import KeyPlan, check_flags, parse_roles
from bc.errors import UsageError

# roles -> (CA and signing keys, worker key alone, serving certificate from the store, relays the trust, listens)
PLANS = {
    "api,gateway,worker": (True, False, False, False, True),  # a lab: exactly as before
    "api,gateway": (True, False, False, False, True),
    "api,worker": (True, False, False, False, True),
    "api": (True, False, False, False, True),
    "gateway,worker": (False, True, True, False, True),
    "gateway": (False, False, True, True, True),
    "worker": (False, True, False, False, False),
}


@pytest.mark.parametrize("roles", sorted(PLANS))
def test_each_subset_of_roles_reads_the_keys_its_roles_need_and_no_more(roles: str) -> None:
    p = KeyPlan(parse_roles(roles))
    assert (p.ca, p.worker_key, p.serving_from_store, p.relays_trust, p.listens) == PLANS[roles]


def test_only_the_api_role_reads_the_ca_key() -> None:
    for roles in PLANS:
        assert KeyPlan(parse_roles(roles)).ca == ("api" in roles.split(","))


@pytest.mark.parametrize(
    ("roles", "flag", "says"),
    [
        ("worker", "listen", "--listen needs a role that listens (api or gateway); --roles worker would ignore it"),
        ("worker", "advertise", "--advertise"),
        ("worker", "release_listen", "--release-listen"),
        ("api,gateway", "api", "--api is where a gateway without the api role forwards Join and Renew"),
        ("worker", "api", "--api"),
        ("gateway,worker", "command_signing", "--command-signing is decided where the signing keys are made"),
    ],
)
def test_a_flag_the_roles_would_ignore_is_a_usage_error(roles: str, flag: str, says: str) -> None:
    with pytest.raises(UsageError, match="^" + says.replace("(", r"\(").replace(")", r"\)")) as e:
        check_flags(parse_roles(roles), [flag])
    assert e.value.exit_code == 2 and "\n" not in e.value.message


@pytest.mark.parametrize(
    ("roles", "flags"),
    [
        ("api,gateway,worker", ["listen", "advertise", "release_listen", "command_signing"]),
        ("gateway", ["listen", "advertise", "release_listen", "api"]),
        ("gateway,worker", ["listen", "api"]),
        ("api", ["listen", "command_signing"]),
        ("worker", ["store", "gateway_id", "data_dir", "roles", "heartbeat_interval"]),
    ],
)
def test_flags_the_roles_use_are_taken(roles: str, flags: list[str]) -> None:
    check_flags(parse_roles(roles), flags)
