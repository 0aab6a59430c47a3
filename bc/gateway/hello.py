"""The Hello transaction: check the certificate against the store, bump the epoch, route the node here."""

from __future__ import annotations

import json
from dataclasses import dataclass

from google.protobuf import json_format

from bc.control.bus import Bus
from bc.control.events import publish
from bc.errors import Unauthenticated
from bc.pki.identity import PeerIdentity
from bc.protocol.pb import session_pb2
from bc.store import Store
from bc.store import identity as id_sql
from bc.store import nodes as nodes_sql


@dataclass(frozen=True)
class HelloResult:
    epoch: int
    generation: int
    inventory_hash: str


async def hello_transaction(
    store: Store, bus: Bus, gateway_id: str, peer: PeerIdentity, hello: session_pb2.Hello
) -> HelloResult:
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        cert = await id_sql.get_cert(tx, peer.serial)
        node = await nodes_sql.get(tx, peer.name)
        if cert is None or node is None or str(cert["node_id"]) != peer.name:
            raise Unauthenticated(f"certificate {peer.serial} is not a certificate of node {peer.name}")
        if cert["revoked_at_ms"] is not None:
            raise Unauthenticated(f"certificate {peer.serial} of node {peer.name} has been revoked")
        if int(cert["identity_generation"]) != int(node["identity_generation"]):
            raise Unauthenticated(
                f"certificate {peer.serial} belongs to an older identity of node {peer.name}; join again"
            )
        opened = await nodes_sql.open_session(
            tx,
            node_id=peer.name,
            gateway_id=gateway_id,
            journal_id=hello.journal_id,
            boot_id=hello.boot_id,
            incarnation_id=hello.incarnation_id,
            cert_serial=peer.serial,
            now_ms=now_ms,
        )
        await nodes_sql.set_applied(tx, peer.name, opened.epoch, hello.applied_generation, hello.applied_spec_hash)
        await nodes_sql.write_capabilities(tx, peer.name, json.dumps(sorted(hello.capabilities)))
        inventory_hash = str(node["inventory_hash"])
        if hello.HasField("inventory"):
            inventory_hash = hello.inventory_hash
            await nodes_sql.write_inventory(
                tx,
                peer.name,
                json_format.MessageToJson(hello.inventory, preserving_proto_field_name=True),
                inventory_hash,
            )
        await publish(
            tx,
            bus,
            "node.connectivity",
            peer.name,
            {
                "state": "connected",
                "epoch": opened.epoch,
                "gateway_id": gateway_id,
                "boot_id": hello.boot_id,
                "journal_id": hello.journal_id,
                "applied_generation": hello.applied_generation,
                "new_journal": bool(opened.previous_journal_id) and opened.previous_journal_id != hello.journal_id,
                "new_boot": bool(opened.previous_boot_id) and opened.previous_boot_id != hello.boot_id,
            },
            now_ms,
        )
        generation = int(node["generation"])
    return HelloResult(opened.epoch, generation, inventory_hash)
