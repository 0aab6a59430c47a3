"""`toor`, `ROOT`: a principal whose user is uid 0 on the node counts as root, whatever its spelling.

* At the node: a spec that adds `ROOT@n1` (or any name getpwnam maps to uid
  0 there) to the access section, signed by the worker key but without the
  quorum, is refused once the node holds approvers; an ordinary user's
  principal under the same CA is not root-equivalent there (every `bc ssh
  grant` adds one).
* With `toor:x:0:0` in the passwd database the node reads, `toor` is root;
  with the same name at uid 1000 it is not.
* At the control plane: `bc ssh grant --principal ROOT` by an operator is the
  quorum's batch, exactly as `root` is, and no certificate is signed.
"""

from __future__ import annotations

import json
import pwd
from collections.abc import Callable
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric import ed25519

from agent import spec_quorum
from bc.control.nodes import specs
from bc.pki import ssh as ssh_pki
from bc.protocol.pb import admin_pb2, common_pb2, session_pb2, spec_pb2
from tests.integration import conftest as lab_fixtures
from tests.integration.conftest import InprocLab
from tests.integration.operators_lab import add_operator, approvers, as_operator, sign
from tests.integration.test_compromised_gateway import until
from tests.security.rootequiv_helpers import OWN_CA, holds_approvers, node

lab, store_url = lab_fixtures.lab, lab_fixtures.store_url  # the in-process lab, on each store


def add_principal(name: str) -> Callable[[spec_pb2.NodeSpec], None]:
    def mutate(spec: spec_pb2.NodeSpec) -> None:
        spec.access.principals.append(name)

    return mutate


async def forge(lab: InprocLab, mutate: Callable[[spec_pb2.NodeSpec], None]) -> int:
    """The control plane writes and signs a spec itself, with its worker key and no batch."""
    server = lab.server
    async with server.store.transaction() as tx:
        w = await specs.write_spec(tx, server.bus, server.signer, "n1", mutate, await server.store.now_ms())
    return w.generation


async def test_a_root_principal_in_any_spelling_needs_the_quorum_at_the_node(lab: InprocLab) -> None:
    await node(lab)
    await lab.admin.set_spec_section("n1", "access", json.dumps({"ssh_ca_keys": [OWN_CA]}))  # before approvers
    await until(lambda: len(lab.agents["n1"].state.spec.access.ssh_ca_keys) == 1)
    await approvers(lab, n=2, k=2)
    await holds_approvers(lab, 2)

    gen = await forge(lab, add_principal("ROOT@n1"))
    ev = await lab.wait_event("security.spec-rejected", lambda ev, d: ev.subject == "n1" and d["generation"] == gen)
    why = json.loads(ev.data_json)["reason"]
    assert "ROOT_EQUIVALENT" in why and "'ROOT@n1'" in why and "uid 0" in why
    assert list(lab.agents["n1"].state.spec.access.principals) == []

    # Replace the refused spec with one that adds an ordinary user instead: the node takes it.
    def oncall(spec: spec_pb2.NodeSpec) -> None:
        del spec.access.principals[:]
        spec.access.principals.append("oncall@n1")

    gen = await forge(lab, oncall)
    await until(lambda: lab.agents["n1"].applied_generation == gen)


def passwd(tmp_path: Path, line: str) -> Callable[[str], pwd.struct_passwd]:
    """getpwnam over a passwd file the test owns (as /etc/passwd is read: name:pw:uid:gid:gecos:dir:shell)."""
    path = tmp_path / "passwd"
    path.write_text(line + "\n")

    def getpwnam(name: str) -> pwd.struct_passwd:
        for entry in path.read_text().splitlines():
            f = entry.split(":")
            if f[0] == name:
                return pwd.struct_passwd((f[0], f[1], int(f[2]), int(f[3]), f[4], f[5], f[6]))
        raise KeyError(name)

    return getpwnam


def test_toor_at_uid_0_is_root_and_at_uid_1000_is_not(tmp_path: Path) -> None:
    bundle = common_pb2.TrustBundle(quorum_k=1)
    bundle.approver_keys.add(key_id="sha256:x", public_key=b"\x00" * 32, name="a")
    held = spec_pb2.NodeSpec()
    held.access.ssh_ca_keys.append(OWN_CA)
    new = spec_pb2.NodeSpec()
    new.CopyFrom(held)
    new.access.principals.append("toor@n1")
    body = session_pb2.DesiredStateBody(node_id="n1", generation=2)
    body.full.CopyFrom(new)

    def check(line: str) -> str | None:
        getpwnam = passwd(tmp_path, line)
        return spec_quorum.check_spec(body, new, held, bundle, 0, lambda n: spec_quorum.is_root_user(n, getpwnam))

    why = check("toor:x:0:0:Bourne again root:/root:/bin/sh")
    assert why is not None and "'toor@n1'" in why and "uid 0" in why
    assert check("toor:x:1000:1000::/home/toor:/bin/sh") is None
    # The host's own database: whatever name it gives uid 0 is root, and ROOT is root in any case.
    assert spec_quorum.is_root_user(pwd.getpwuid(0).pw_name)
    assert spec_quorum.is_root_user("ROOT") and spec_quorum.is_root_user("Root")
    assert not spec_quorum.is_root_user("nobody-here-at-all")


async def test_granting_ROOT_is_the_quorums_batch_like_root(lab: InprocLab, tmp_path: Path) -> None:
    await lab.join("n1")
    await lab.admin.ssh_ca_init()
    await approvers(lab, n=2, k=2)
    bob = await add_operator(lab, "bob", "operator")
    user_key = ssh_pki.public_line(ed25519.Ed25519PrivateKey.generate())
    for spelling in ("ROOT", "Root"):
        req = admin_pb2.SshGrantRequest(node_id="n1", principal=spelling, public_key=user_key, reason="x")
        g = await as_operator(bob, lambda c, req=req: c.ssh_grant(req))
        assert (g.state, g.certificate) == ("pending", "") and g.batch_id, g
    access = json.loads((await lab.admin.get_spec("n1")).spec_json).get("access", {})
    assert "principals" not in access


async def test_an_approved_root_grant_reaches_the_node_with_its_approval(lab: InprocLab) -> None:
    await node(lab)
    await lab.admin.ssh_ca_init()
    await until(lambda: len(lab.agents["n1"].state.spec.access.ssh_ca_keys) == 1)
    quorum = await approvers(lab, n=2, k=2)
    await holds_approvers(lab, 2)
    bob = await add_operator(lab, "bob", "operator")
    user_key = ssh_pki.public_line(ed25519.Ed25519PrivateKey.generate())
    req = admin_pb2.SshGrantRequest(node_id="n1", principal="root", public_key=user_key, reason="kernel panic")
    g = await as_operator(bob, lambda c: c.ssh_grant(req))
    b = await lab.admin.get_batch(g.batch_id)
    for a in quorum:
        b = await sign(lab, b, a)
    assert b.state == "approved"
    cert = await as_operator(bob, lambda c: c.get_ssh_grant(batch_id=g.batch_id))
    assert cert.certificate
    # The node checks the grant batch's signatures itself, and takes root@n1.
    await until(lambda: list(lab.agents["n1"].state.spec.access.principals) == ["root@n1"])
