"""The Signer is an explicit dependency: the unsigned form of `NullSigner`, and no unsigned intent with signing on.

* `NullSigner` (signing off) gives the documented unsigned form: a NULL signature and an empty key id in the
  row, no roots and no envelope for the trust bundle, no attestation, and a refusal to rotate.
* With a `KeySigner`, every writer of intent — a join's first spec, a spec section, a reservation and its
  release, a failed allocation, a command, a batch — stores a signature that verifies under the root.
* No code path reaches the store around the signer: the only callers of the store's intent writes are the
  functions that take a required `signer: Signer` (checked on the source, as `test_source_rules` does).
* The events log carries no signature: a digest of it replays from a seed, and signatures are randomized.
"""

from __future__ import annotations

import ast
import base64
import inspect
import json
import random
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from google.protobuf import any_pb2

from bc.control.base.bus import Bus
from bc.control.capacity import reservations
from bc.control.commands import queue as commands
from bc.control.commands.queue import EnqueueRequest, enqueue
from bc.control.nodes import specs
from bc.control.quorum import batches as quorum
from bc.control.signing.signer import UNSIGNED, KeySigner, NullSigner, Signer
from bc.control.trust import identity, intent
from bc.errors import UsageError
from bc.pki import keys, tokens
from bc.pki.ca import CertificateAuthority
from bc.pki.identity import make_csr
from bc.pki.secrets_source import SystemSecrets
from bc.pki.signing import PURPOSE_COMMAND, PURPOSE_DESIRED_STATE, SigningKeys, Verifier
from bc.protocol.pb import common_pb2
from bc.seams.clock import LoopClock
from bc.store import Row
from bc.store import commands as cmd_sql
from bc.store import events as events_sql
from bc.store import nodes as nodes_sql
from bc.store import signing as signing_sql
from bc.store.sqlite import InlineSqliteStore
from tests.unit.control.quorum_setup import add_operator, install

ROOT = Path(__file__).resolve().parents[3]
SECRETS = SystemSecrets()

AddNode = Callable[..., Awaitable[common_pb2.Inventory]]


async def all_rows(store: InlineSqliteStore) -> tuple[list[Row], list[Row]]:
    async with store.transaction(write=False) as tx:
        cmds = await cmd_sql.list_(tx, limit=1000)
        nodes = await nodes_sql.list_all(tx)
    return cmds, nodes


# -- signing off: the documented unsigned form ----------------------------------------------------


def test_the_null_signer_gives_the_documented_unsigned_form(clock: LoopClock, rng: random.Random) -> None:
    s = NullSigner()
    assert s.sign_command(b"body") == s.sign_spec(b"body") == UNSIGNED
    assert (UNSIGNED.signature, UNSIGNED.key_id, UNSIGNED.stored) == (b"", "", None)
    assert s.sign_trust_bundle(b"bundle") is None and s.roots() == [] and s.keys is None
    assert not s.attested
    with pytest.raises(UsageError, match="command signing is off on this server"):
        s.rotate_worker(clock, rng, SECRETS)


async def test_with_signing_off_commands_and_specs_are_stored_unsigned(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode, rng: random.Random
) -> None:
    await add_node("n1")
    signer = NullSigner()
    row = await enqueue(store, bus, signer, EnqueueRequest("n1", "inventory.refresh", any_pb2.Any()), rng)
    await specs.set_section(store, bus, signer, "n1", "telemetry", '{"otlp_endpoint": "https://a:4317"}')
    [cmd], [node] = await all_rows(store)
    assert (cmd["id"], cmd["signature"], cmd["signer_key_id"]) == (row["id"], None, "")
    assert node["spec_body"] is not None and node["spec_signature"] is None and node["spec_key_id"] == ""


# -- signing on: every writer signs ---------------------------------------------------------------


async def test_with_signing_on_every_writer_of_intent_stores_a_valid_signature(
    tmp_path: Path, store: InlineSqliteStore, bus: Bus, clock: LoopClock, add_node: AddNode, rng: random.Random
) -> None:
    signer = KeySigner(SigningKeys.create(tmp_path / "pki", clock, rng, SECRETS))
    await intent.register(store, signer)
    ca = CertificateAuthority.create(clock, rng, SECRETS)
    # A join writes the node's first spec.
    tok = await identity.create_token(store, bus, ca, clock, "n1", "node", 3600, rng=rng, secrets=SECRETS)
    csr = make_csr(keys.generate_key(), "n1").public_bytes(serialization.Encoding.DER)
    parsed = tokens.parse_token(tok.token)
    proof = tokens.join_proof(parsed.secret, parsed.token_id, csr)
    await identity.join(store, bus, signer, ca, parsed.token_id, csr, "host-1", proof=proof)
    await add_node("n1")  # its inventory, for placement
    await add_node("n2")
    await add_node("n3")
    await specs.set_section(store, bus, signer, "n2", "telemetry", '{"otlp_endpoint": "https://a:4317"}')
    kept = await reservations.reserve(store, bus, signer, reservations.ReserveRequest(gpus=1, node_id="n1"), rng)
    gone = await reservations.reserve(store, bus, signer, reservations.ReserveRequest(gpus=1, node_id="n2"), rng)
    await reservations.release(store, bus, signer, str(gone["id"]))
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        alloc = str(kept["allocation_id"])
        assert await reservations.on_allocation_report(tx, bus, signer, "n1", "failed", alloc, "x", "", now_ms)
    await enqueue(store, bus, signer, EnqueueRequest("n3", "inventory.refresh", any_pb2.Any()), rng)
    await install(store, bus, {n: ed25519.Ed25519PrivateKey.generate() for n in ("alice", "bob")}, k=1)
    await add_operator(store, "ops")
    batch = quorum.BatchRequest(kind="gpu.reset", node_ids=["n1", "n2"], payload_json='{"gpu_uuids": ["GPU-1"]}')
    await quorum.create_batch(store, bus, signer, batch, "ops", rng)

    v = Verifier([signer.keys.root_pem])
    der = signer.keys.worker.cert_der
    cmds, rows = await all_rows(store)
    nodes = [n for n in rows if n["spec_body"] is not None]  # n3 only has a command
    assert len(cmds) == 3 and {n["node_id"] for n in nodes} == {"n1", "n2"}
    for r in cmds:
        env = common_pb2.Envelope(
            purpose=PURPOSE_COMMAND,
            body=bytes(r["body"]),
            signature=bytes(r["signature"] or b""),
            key_id=str(r["signer_key_id"]),
            cert_chain=[der],
        )
        assert v.verify(env, PURPOSE_COMMAND, clock.now()) == signer.keys.worker.key_id, r["kind"]
    for n in nodes:
        env = common_pb2.Envelope(
            purpose=PURPOSE_DESIRED_STATE,
            body=bytes(n["spec_body"]),
            signature=bytes(n["spec_signature"] or b""),
            key_id=str(n["spec_key_id"]),
            cert_chain=[der],
        )
        assert v.verify(env, PURPOSE_DESIRED_STATE, None) == signer.keys.worker.key_id, n["node_id"]
    assert {int(n["generation"]) for n in nodes} == {3}  # join, reserve, failed; a section, reserve, release

    # The events log names keys, never carries what they signed with.
    async with store.transaction(write=False) as tx:
        data = [json.loads(str(e["data"])) for e in await events_sql.list_events(tx, 0, 10_000)]
    assert len(data) > 10
    logged = json.dumps(data)
    sigs = [bytes(r["signature"]) for r in cmds] + [bytes(n["spec_signature"]) for n in nodes]
    for sig in sigs:
        for form in (sig.hex(), base64.b64encode(sig).decode(), base64.urlsafe_b64encode(sig).decode().rstrip("=")):
            assert form not in logged
    assert not [k for d in data for k in d if "sig" in k]


# -- no path around the signer --------------------------------------------------------------------

STORE_WRITES = {
    ("commands", "insert"): "a command body and its signature",
    ("nodes", "write_spec"): "a spec body and its signature",
    ("signing", "resign_spec"): "a new signature over a stored spec",
    ("signing", "resign_command"): "a new signature over a stored command",
}
WRITERS = {
    "bc/control/commands/queue.py": {"enqueue_in"},
    "bc/control/nodes/specs.py": {"write_spec"},
    "bc/control/trust/intent.py": {"rotate"},
}
"""The only functions outside bc/store that store intent or its signature; each takes a required Signer."""


def store_writes(tree: ast.AST) -> list[tuple[str, str, int]]:
    """(enclosing function, store call, line) for every call of an intent write of the store."""
    aliases: dict[str, str] = {}  # local name -> store module
    direct: dict[str, tuple[str, str]] = {}  # local name -> (store module, function)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "bc.store":
            for a in node.names:
                aliases[a.asname or a.name] = a.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("bc.store."):
            for a in node.names:
                direct[a.asname or a.name] = (node.module.removeprefix("bc.store."), a.name)
    out: list[tuple[str, str, int]] = []

    def visit(node: ast.AST, fn: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else fn
            if isinstance(child, ast.Call):
                f = child.func
                key = None
                if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in aliases:
                    key = (aliases[f.value.id], f.attr)
                elif isinstance(f, ast.Name) and f.id in direct:
                    key = direct[f.id]
                if key in STORE_WRITES:
                    out.append((fn, ".".join(key), child.lineno))
            visit(child, name)

    visit(tree, "<module>")
    return out


def test_only_the_signing_writers_store_intent() -> None:
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / "bc").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(("bc/store/", "bc/protocol/pb/")):
            continue
        for fn, _call, _line in store_writes(ast.parse(path.read_text(encoding="utf-8"))):
            found.setdefault(rel, set()).add(fn)
    assert found == WRITERS


@pytest.mark.parametrize(
    "fn", [commands.enqueue, commands.enqueue_in, specs.write_spec, specs.set_section, intent.rotate]
)
def test_each_writer_requires_a_signer(fn: Callable[..., object]) -> None:
    p = inspect.signature(fn).parameters["signer"]
    assert p.default is inspect.Parameter.empty and p.annotation in ("Signer", Signer)


def test_the_rule_catches_what_it_is_for() -> None:
    bad = ast.parse(
        "from bc.store import commands as c, nodes\n"
        "from bc.store.signing import resign_spec\n"
        "async def sneak(tx):\n"
        "    await c.insert(tx)\n"
        "    await nodes.write_spec(tx)\n"
        "    await resign_spec(tx)\n"
        "    await nodes.get(tx)\n"
    )
    assert store_writes(bad) == [
        ("sneak", "commands.insert", 4),
        ("sneak", "nodes.write_spec", 5),
        ("sneak", "signing.resign_spec", 6),
    ]


def test_the_store_writes_named_here_exist() -> None:
    """A renamed store function would make the rule above find nothing, silently."""
    store_modules = {"commands": cmd_sql, "nodes": nodes_sql, "signing": signing_sql}
    for module, fn in STORE_WRITES:
        assert inspect.iscoroutinefunction(getattr(store_modules[module], fn)), (module, fn)
