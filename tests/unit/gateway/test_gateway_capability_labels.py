"""The gateway writes a node's advertised capabilities as `bc.dev/cap.<name>=1` labels, keeping the operator's."""

from __future__ import annotations

import json

import pytest

from bc.control.base.bus import Bus
from bc.gateway.hello import CAPABILITY_PREFIX, capability_labels, hello_transaction
from bc.pki.identity import PeerIdentity
from bc.protocol.pb import session_pb2
from bc.store import nodes as nodes_sql
from bc.store.sqlite import InlineSqliteStore
from tests.unit.gateway.test_duplicate_session import GW, NODE, SIGNER, ca, peer  # noqa: F401  (fixtures)

pytestmark = pytest.mark.usefixtures("gateway_lease")  # hello_transaction routes as gw-1


def test_capability_labels_replace_the_old_ones_and_keep_the_operators() -> None:
    before = {"pool": "a100", "bc.dev/cap.devices.cdi": "1", "bc.dev/cap.gone": "1", "bc.dev/driver.x": "1"}
    after = capability_labels(before, ["devices.limits", "devices.cdi", "binding.kubernetes"])
    assert after == {
        "bc.dev/cap.binding.kubernetes": "1",
        "bc.dev/cap.devices.cdi": "1",
        "bc.dev/cap.devices.limits": "1",
        "bc.dev/driver.x": "1",
        "pool": "a100",
    }
    assert capability_labels(before, []) == {"pool": "a100", "bc.dev/driver.x": "1"}


def test_a_capability_that_is_no_label_key_is_skipped() -> None:
    caps = ["ok", "has space", "ünï", "x" * 80, "a/b", "end-"]
    assert capability_labels({}, caps) == {"bc.dev/cap.ok": "1"}
    many = capability_labels({}, [f"c{i:03d}" for i in range(100)])
    assert len(many) == 32 and all(k.startswith(CAPABILITY_PREFIX) for k in many)


async def labels(store: InlineSqliteStore) -> dict[str, str]:
    async with store.transaction(write=False) as tx:
        row = await nodes_sql.get(tx, NODE)
    assert row is not None
    out: dict[str, str] = json.loads(str(row["labels"]))
    return out


async def test_hello_writes_the_capability_labels(store: InlineSqliteStore, bus: Bus, peer: PeerIdentity) -> None:  # noqa: F811
    async with store.transaction() as tx:
        await nodes_sql.set_labels(tx, NODE, json.dumps({"pool": "a100", "bc.dev/cap.old": "1"}))
    caps = ["binding.kubernetes", "devices.cdi", "devices.limits"]
    hello = session_pb2.Hello(node_id=NODE, boot_id="b1", journal_id="j-1", incarnation_id="i-1", capabilities=caps)
    await hello_transaction(store, bus, SIGNER, GW, peer, hello)
    assert await labels(store) == {
        "bc.dev/cap.binding.kubernetes": "1",
        "bc.dev/cap.devices.cdi": "1",
        "bc.dev/cap.devices.limits": "1",
        "pool": "a100",
    }
    # An older agent that advertises less loses the labels it no longer earns.
    older = session_pb2.Hello(
        node_id=NODE, boot_id="b1", journal_id="j-1", incarnation_id="i-2", capabilities=["devices.cdi"]
    )
    await hello_transaction(store, bus, SIGNER, GW, peer, older)
    assert await labels(store) == {"bc.dev/cap.devices.cdi": "1", "pool": "a100"}
