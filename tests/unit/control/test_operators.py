"""Operators and roles on the server (bc.control.trust.operators, the Admin role table), against the real store."""

from __future__ import annotations

import json
import random

import pytest
from cryptography.hazmat.primitives import serialization
from hypothesis import given
from hypothesis import strategies as st

from bc.api.admin_roles import PROCESS_ONLY, PURPOSE_ROLE, ROLE_NEEDED
from bc.control.base import actor
from bc.control.base.bus import Bus
from bc.control.trust import operators as ops
from bc.errors import Conflict, NotFound, Unauthenticated, UsageError
from bc.pki import exec_tickets, keys
from bc.pki.ca import CertificateAuthority
from bc.pki.identity import SAFE_NAME, PeerIdentity, check_safe_name, peer_identity
from bc.pki.secrets_source import SystemSecrets
from bc.protocol.pb import admin_pb2, tunnel_pb2
from bc.seams.clock import LoopClock
from bc.store import events as events_sql
from bc.store.sqlite import InlineSqliteStore

RNG = random.Random(1)  # ids and serials, as the one seeded Random of a process would give them
SECRETS = SystemSecrets()


@pytest.fixture
def ca(clock: LoopClock) -> CertificateAuthority:
    return CertificateAuthority.create(clock, RNG, SECRETS)


def public_pem() -> bytes:
    return (
        keys.generate_key()
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )


async def add(store: InlineSqliteStore, bus: Bus, ca: CertificateAuthority, name: str, role: str) -> PeerIdentity:
    """An operator and the identity its certificate gives a caller."""
    _, cert_pem = await ops.add(store, bus, ca, name, role, public_pem(), "local")
    return peer_identity(keys.load_cert_pem(cert_pem), ca.certificate)


# -- the role table ---------------------------------------------------------------------------------------


def test_every_admin_rpc_has_a_role_and_nothing_else_does() -> None:
    rpcs = {m.name for m in admin_pb2.DESCRIPTOR.services_by_name["Admin"].methods}
    tunnels = tunnel_pb2.DESCRIPTOR.services_by_name["Tunnels"].methods
    rpcs |= {m.name for m in tunnels}  # one table for both
    assert len(rpcs) == len(admin_pb2.DESCRIPTOR.services_by_name["Admin"].methods) + len(tunnels)
    assert set(ROLE_NEEDED) == rpcs
    assert {role for role, _ in ROLE_NEEDED.values()} <= set(actor.ROLES)


def test_the_internal_relay_needs_a_control_plane_certificate_and_no_operator_role() -> None:
    """`GatewayTunnels` (api -> gateway) is in the one table of who may call what, never an operator's."""
    internal = {m.name for m in tunnel_pb2.DESCRIPTOR.services_by_name["GatewayTunnels"].methods}
    assert set(PROCESS_ONLY) == internal
    assert not set(PROCESS_ONLY) & set(ROLE_NEEDED)
    assert {kind for kind, _ in PROCESS_ONLY.values()} == {"gateway"}


def test_every_ticket_purpose_has_a_role_and_viewers_get_none() -> None:
    assert set(PURPOSE_ROLE) == set(exec_tickets.PURPOSES)
    assert "viewer" not in PURPOSE_ROLE.values()
    assert ROLE_NEEDED["CloseTunnel"][0] == ROLE_NEEDED["RotateTicketKey"][0] == "admin"
    assert ROLE_NEEDED["SetRecordPolicy"][0] == ROLE_NEEDED["GetTypescript"][0] == "admin"
    assert ROLE_NEEDED["UploadTypescript"][0] == "operator" and ROLE_NEEDED["GetRecordPolicy"][0] == "viewer"


def test_viewers_only_list_get_and_watch() -> None:
    viewer = {rpc for rpc, (role, _) in ROLE_NEEDED.items() if role == "viewer"}
    assert all(rpc.startswith(("List", "Get", "Watch", "ServerInfo")) for rpc in viewer), viewer


@pytest.mark.parametrize(
    "rpc",
    [
        "CreateToken",
        "RevokeNode",
        "CordonNode",
        "LabelNode",
        "DeleteNode",
        "RotateSigningKey",
        "AddApprover",
        "AddOperator",
    ],
)
def test_tokens_nodes_approvers_operators_and_the_pki_are_for_admins(rpc: str) -> None:
    assert ROLE_NEEDED[rpc][0] == "admin"


# -- authorize --------------------------------------------------------------------------------------------


async def test_a_caller_is_authorized_by_role(store: InlineSqliteStore, bus: Bus, ca: CertificateAuthority) -> None:
    viewer = await add(store, bus, ca, "bob", "viewer")
    assert await ops.authorize(store, viewer, "viewer", "listing nodes") == actor.Caller("bob", "viewer")
    with pytest.raises(
        Unauthenticated, match=r"^running a command needs the operator role; operator bob has the viewer role$"
    ):
        await ops.authorize(store, viewer, "operator", "running a command")
    admin = await add(store, bus, ca, "ann", "admin")
    for need in actor.ROLES:
        assert (await ops.authorize(store, admin, need, "x")).role == "admin"


async def test_a_certificate_the_server_never_registered_is_refused(
    store: InlineSqliteStore, bus: Bus, ca: CertificateAuthority
) -> None:
    await add(store, bus, ca, "bob", "admin")
    # The CA's signature alone is not enough: e.g. a certificate minted with the CA key outside `bc operators add`.
    stray = peer_identity(ca.issue_operator_cert("bob", keys.generate_key()), ca.certificate)
    with pytest.raises(
        Unauthenticated, match=f"this certificate \\(serial {stray.serial}\\) was not issued to operator bob"
    ):
        await ops.authorize(store, stray, "viewer", "listing nodes")
    ghost = peer_identity(ca.issue_operator_cert("ghost", keys.generate_key()), ca.certificate)
    with pytest.raises(Unauthenticated, match="operator 'ghost' is not known to this server"):
        await ops.authorize(store, ghost, "viewer", "listing nodes")


async def test_anothers_registered_serial_does_not_pass_for_you(
    store: InlineSqliteStore, bus: Bus, ca: CertificateAuthority
) -> None:
    await add(store, bus, ca, "bob", "viewer")
    ann = await add(store, bus, ca, "ann", "admin")
    bob_with_anns_serial = PeerIdentity("operator", "bob", ann.serial, ann.not_after)
    with pytest.raises(Unauthenticated, match="was not issued to operator bob"):
        await ops.authorize(store, bob_with_anns_serial, "viewer", "x")


# -- add and revoke --------------------------------------------------------------------------------------


async def test_add_refuses_bad_names_roles_keys_and_taken_names(
    store: InlineSqliteStore, bus: Bus, ca: CertificateAuthority
) -> None:
    with pytest.raises(UsageError, match="is not valid"):
        await ops.add(store, bus, ca, "Bob", "viewer", public_pem(), "local")
    with pytest.raises(UsageError, match="the role 'root' is not one of viewer, operator, admin"):
        await ops.add(store, bus, ca, "bob", "root", public_pem(), "local")
    with pytest.raises(UsageError, match="not a PEM public key"):
        await ops.add(store, bus, ca, "bob", "viewer", b"junk", "local")
    await ops.add(store, bus, ca, "bob", "viewer", public_pem(), "local")
    with pytest.raises(Conflict, match="operator bob already exists \\(a viewer\\)"):
        await ops.add(store, bus, ca, "bob", "admin", public_pem(), "local")
    assert [str(r["name"]) for r in await ops.list_all(store)] == ["bob", "local"]


async def test_revoke_refuses_every_certificate_keeps_the_name_and_never_the_last_admin(
    store: InlineSqliteStore, bus: Bus, ca: CertificateAuthority
) -> None:
    bob = await add(store, bus, ca, "bob", "admin")
    row = await ops.revoke(store, bus, "bob", "left", "local")
    assert row["revoked_by"] == "local" and row["revoke_reason"] == "left"
    with pytest.raises(Unauthenticated, match=r"^operator bob was revoked \(left\); ask an admin for a new config$"):
        await ops.authorize(store, bob, "viewer", "x")
    with pytest.raises(Conflict, match="already revoked"):
        await ops.revoke(store, bus, "bob", "", "local")
    with pytest.raises(Conflict, match="a name is never reused"):
        await ops.add(store, bus, ca, "bob", "viewer", public_pem(), "local")
    with pytest.raises(Conflict, match="operator local is the last admin"):
        await ops.revoke(store, bus, "local", "", "local")
    with pytest.raises(NotFound, match="no operator named 'nobody'"):
        await ops.revoke(store, bus, "nobody", "", "local")
    async with store.transaction(write=False) as tx:
        seen = [
            (str(r["type"]), json.loads(str(r["data"]))) for r in await events_sql.list_events(tx, 0, 100, "operator.")
        ]
    assert seen[-1] == ("operator.revoked", {"reason": "left", "by": "local"})


async def test_the_local_operator_is_an_admin_and_serve_registers_its_certificate(
    store: InlineSqliteStore, ca: CertificateAuthority
) -> None:
    (local,) = await ops.list_all(store)
    assert (local["name"], local["role"], local["certificates"]) == ("local", "admin", 0)
    cert = ca.issue_operator_cert("local", keys.generate_key())
    assert await ops.register_local(store, cert) is True
    assert await ops.register_local(store, cert) is True  # every start: once is enough
    assert (await ops.authorize(store, peer_identity(cert, ca.certificate), "admin", "x")).name == "local"
    assert await ops.register_local(store, ca.issue_operator_cert("bob", keys.generate_key())) is False
    assert (await ops.list_all(store))[0]["certificates"] == 1


# -- names ---------------------------------------------------------------------------------------------------


@given(st.text(max_size=70))
def test_safe_names_are_exactly_the_pattern(name: str) -> None:
    ok = SAFE_NAME.fullmatch(name) is not None
    try:
        check_safe_name("operator name", name)
    except UsageError as e:
        assert not ok and e.message.isascii() and "\n" not in e.message
    else:
        assert ok and name.isascii() and name == name.lower() and 1 <= len(name) <= 63
