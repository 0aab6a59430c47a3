"""Signed-intent figures for `make bench`: what signing costs per command, and end to end.

1. Micro figures, µs per operation (median and p99 of many timed runs after a
   warm-up, `time.perf_counter_ns`), on the real code paths and a real encoded
   `CommandBody` of `inventory.refresh`:
   * sign: the worker key signs the body (`Intent.sign_command`, purpose `command`);
   * verify: the agent checks that command's envelope (`AgentTrust.check_command`)
     with the worker's chain already cached (steady state), and the first
     check of a new worker (a fresh verifier each time: chain check included);
   * attest: the node key (P-256, in a file) signs the terminal
     `CommandUpdate` (`NodeKey.attest_update`; its result is a real
     inventory.refresh result of the fake `hgx-h100-8`);
   * attest-verify: the control plane checks it (`attest.verify_by_any` with the
     node's one certificate, issued by a real CA; the message built as
     `attestation.check_result` builds it).
   The per-command overhead is sign + verify (cached) + attest + attest-verify.
2. End to end: `bench.commands`' workload (200 inventory.refresh, enqueue →
   SUCCEEDED over 10 nodes) against a new `bc serve --command-signing off`
   and a new `bc serve --command-signing on` (a new data dir each), in the
   same run, interleaved and repeated (see `signing_figures`), and the ratio.
   The agents attest every result in both runs (they always do); the control
   plane checks attestations only for attested kinds with signing on, and
   inventory.refresh is not one, so the end-to-end difference is the worker
   signature, the relayed certificate and the agent's check.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.x509.oid import NameOID
from google.protobuf import any_pb2

from agent.hw import open_backend
from agent.hw.base import inventory_hash
from agent.node_key import NodeKey
from agent.trust import AgentTrust
from bc.control.trust.intent import Intent
from bc.pki import attest, keys
from bc.pki.ca import CertificateAuthority
from bc.pki.signing import PURPOSE_COMMAND, SigningKeys
from bc.protocol import kinds
from bc.protocol.canonical import canonical_json, message_to_dict
from bc.protocol.pb import common_pb2, kinds_pb2, session_pb2
from bc.seams.clock import SystemClock
from bc.seams.ids import ulid
from bench.commands import commands_per_second

WARMUP = 200
RUNS = 5000
RUNS_UNCACHED = 1000  # each one parses a certificate and checks the root's signature on it


def timed_us(op: Callable[[], object], runs: int = RUNS, setup: Callable[[], object] | None = None) -> dict[str, float]:
    """Median and p99 of `op` in µs; `setup` (untimed) runs before each call when given."""
    for _ in range(WARMUP):
        if setup is not None:
            setup()
        op()
    samples: list[int] = []
    for _ in range(runs):
        if setup is not None:
            setup()
        t0 = time.perf_counter_ns()
        op()
        samples.append(time.perf_counter_ns() - t0)
    samples.sort()
    return {
        "median_us": round(statistics.median(samples) / 1000, 1),
        "p99_us": round(samples[min(len(samples) - 1, int(len(samples) * 0.99))] / 1000, 1),
    }


def command_body(node_id: str, seq: int) -> bytes:
    """An inventory.refresh body encoded as `bc.control.commands.queue.enqueue` encodes it."""
    kind = kinds.KINDS["inventory.refresh"]
    payload = any_pb2.Any()
    payload.Pack(kinds_pb2.InventoryRefreshRequest(), deterministic=True)
    cid = ulid(time.time())
    body = session_pb2.CommandBody(
        id=cid,
        node_id=node_id,
        seq=seq,
        kind=kind.name,
        payload=payload,
        lane=session_pb2.Lane.Name(kinds.LANES[kind.lane]),
        not_after_ms=int(time.time() * 1000) + 120_000,
        retry_safe=kind.retry_safe,
        idempotency_key=f"cmd:{cid}",
        self_terminating=kind.self_terminating,
        attested=kind.attested,
    )
    return body.SerializeToString(deterministic=True)


def micro_figures(tmp: Path) -> dict[str, Any]:
    clock = SystemClock()
    node_id = "c0000"

    # The control plane: CA, command-signing root and worker key, as `bc serve` makes them.
    ca = CertificateAuthority.create(clock)
    intent = Intent(SigningKeys.create(tmp / "pki", clock), ca.ca_pem)
    worker = intent.worker
    assert worker is not None
    body = command_body(node_id, 1)
    signed = intent.sign_command(body)
    assert signed is not None
    env = common_pb2.Envelope(
        purpose=PURPOSE_COMMAND,
        body=body,
        signature=signed.signature,
        key_id=signed.key_id,
        cert_chain=[worker.cert_der],  # what the gateway relays (`attach_signer`)
    )
    cmd = session_pb2.Command(envelope=env, attempt=0)
    bundle = intent.trust_bundle()

    # The node: its P-256 key in a file and the certificate the CA issued for it.
    node_key_path = tmp / "node.key"
    node_priv = keys.generate_key()
    keys.write_private_key(node_key_path, node_priv)
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"node:{node_id}")]))
        .sign(node_priv, hashes.SHA256())
    )
    node_cert = ca.issue_node_cert(csr, node_id, "node", 1)
    node_key = NodeKey(node_key_path)
    inv = open_backend("hgx-h100-8", node_id).inventory()
    result = canonical_json({"inventory": message_to_dict(inv), "inventory_hash": inventory_hash(inv)}).encode()
    update = session_pb2.CommandUpdate(
        command_id=ulid(time.time()), state=session_pb2.COMMAND_SUCCEEDED, result=result, boot_id="bench"
    )

    trust = AgentTrust(bundle)
    assert trust.enforcing
    now = time.time()
    if (why := trust.check_command(cmd, now)) is not None:
        raise AssertionError(f"the signed command does not verify: {why}")
    fresh: list[AgentTrust] = []

    def new_verifier() -> None:
        fresh.clear()
        fresh.append(AgentTrust(bundle))  # a new Verifier: nothing cached

    def verify_uncached() -> None:
        if fresh[0].check_command(cmd, now) is not None:
            raise AssertionError("the signed command does not verify")

    def verify_cached() -> None:
        if trust.check_command(cmd, now) is not None:
            raise AssertionError("the signed command does not verify")

    def clear_sig() -> None:
        update.node_sig = b""  # attest_update is idempotent: sign afresh each time

    def attest_verify() -> None:
        # As `bc.control.signing.attestation.check_result` does, once the certificate is parsed (it caches them).
        msg = attest.result_message(update.command_id, session_pb2.CommandState.Name(update.state), update.result)
        if not attest.verify_by_any([node_cert], msg, update.node_sig):
            raise AssertionError("the attested result does not verify")

    ops = {
        "sign (worker, Ed25519)": timed_us(lambda: intent.sign_command(body)),
        "verify (agent, chain cached)": timed_us(verify_cached),
        "verify (agent, new worker)": timed_us(verify_uncached, RUNS_UNCACHED, setup=new_verifier),
        "attest (node, P-256)": timed_us(lambda: node_key.attest_update(update), setup=clear_sig),
    }
    node_key.attest_update(update)
    ops["attest-verify (control plane)"] = timed_us(attest_verify)
    steady = [v["median_us"] for k, v in ops.items() if k != "verify (agent, new worker)"]
    return {
        "ops": ops,
        "per_command_median_us": round(sum(steady), 1),  # a new worker's chain check is once per worker
        "sizes": {
            "body": len(body),
            "signature": len(signed.signature),
            "worker_cert": len(worker.cert_der),
            "result": len(result),
            "node_sig": len(update.node_sig),
        },
    }


async def signing_figures(nodes: int = 10, commands: int = 200, rounds: int = 3) -> dict[str, Any]:
    """The micro figures, then the end-to-end rate with signing off and on, interleaved.

    The first end-to-end run in a process is slower whatever its flag (a
    warm-up the bench process pays: imports, first channels), so one
    untimed run goes first; then `rounds` pairs, alternating which flag runs
    first, each against a new data dir. The medians make the figures, and
    every pair's own rates are kept so the spread shows.
    """
    with tempfile.TemporaryDirectory(prefix="bc-bench-sign-") as d:
        micro = micro_figures(Path(d))
    await commands_per_second(nodes, commands // 4, ("--command-signing", "on"))  # warm-up, discarded
    runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    for i in range(rounds):
        for flag in ("off", "on") if i % 2 == 0 else ("on", "off"):
            runs[flag].append(await commands_per_second(nodes, commands, ("--command-signing", flag)))
    e2e = {
        flag: {
            "commands_per_s": round(statistics.median(r["commands_per_s"] for r in rs), 1),
            "each": [r["commands_per_s"] for r in rs],
            "agents_enforcing": min(r["agents_enforcing"] for r in rs),
        }
        for flag, rs in runs.items()
    }
    return {
        "micro": micro,
        "nodes": nodes,
        "commands": commands,
        "rounds": rounds,
        **e2e,
        "ratio": round(e2e["on"]["commands_per_s"] / e2e["off"]["commands_per_s"], 2),
    }


def print_table(f: dict[str, Any]) -> None:
    micro = f["micro"]
    print(f"signed intent, µs per operation ({RUNS} runs, {RUNS_UNCACHED} for a new worker)   median      p99")
    for name, v in micro["ops"].items():
        print(f"  {name:<62}{v['median_us']:7.1f}  {v['p99_us']:7.1f}")
    total = "per command: sign + verify (cached) + attest + attest-verify"
    print(f"  {total:<62}{micro['per_command_median_us']:7.1f}")
    print("  sizes (bytes): " + ", ".join(f"{k} {v}" for k, v in micro["sizes"].items()))
    print(
        f"inventory.refresh end to end ({f['nodes']} nodes, {f['commands']} commands, enqueue -> SUCCEEDED;"
        f" median of {f['rounds']} interleaved runs each)"
    )
    for flag in ("off", "on"):
        r = f[flag]
        each = ", ".join(f"{x:.1f}" for x in r["each"])
        print(
            f"  command signing {flag:<4}{r['commands_per_s']:7.1f} commands/s  (runs: {each};"
            f" {r['agents_enforcing']}/{f['nodes']} agents enforcing)"
        )
    print(f"  on / off            {f['ratio']:7.2f}", flush=True)
