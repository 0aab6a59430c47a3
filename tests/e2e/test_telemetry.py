"""Telemetry end to end (issue 17): a `telemetry` section rolled out with `bc jobs run rollout` makes the
node export its metrics to an OTLP receiver inside the test (gRPC, then HTTP), decoded with
opentelemetry-proto; an endpoint that is not a URL fails the section with the reason while the rest of the
spec converges; `bc serve --otlp-endpoint` exports the server's own metrics.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.otlp_receiver import Received, grpc_receiver, http_receiver

from .harness import HEARTBEAT_S, Lab, assert_no_tracebacks, bring_up

NODE_METRICS = {
    "bc.agent.commands",
    "bc.agent.command.duration",
    "bc.agent.converge.duration",
    "bc.agent.journal.size",
    "bc.agent.journal.unacked_events",
    "bc.agent.session.connected",
    "bc.gpu.utilization",
    "bc.gpu.memory.used",
    "bc.gpu.temperature",
    "bc.gpu.power",
    "bc.gpu.ecc.errors",
}


def rollout(lab: Lab, section: dict[str, Any], *, wait: bool = True) -> None:
    path = lab.root / "telemetry.json"
    path.write_text(json.dumps(section))
    args = ["jobs", "run", "rollout", "--section", "telemetry", "--file", str(path), "--nodes", "n1"]
    lab.bc(*args, *([] if wait else ["--no-wait"]), timeout=60)


def section_state(lab: Lab, name: str) -> dict[str, Any]:
    (s,) = [s for s in lab.show("n1").get("sections", []) if s["section"] == name]
    return dict(s)


def _exported(received: Received, gpus: int) -> bool:
    if not received.names() >= NODE_METRICS:
        return False
    return len({a["gpu.uuid"] for a, _, _ in received.points("bc.gpu.temperature")}) == gpus and bool(
        received.points("bc.agent.commands")
    )


def _check_node_export(lab: Lab, received: Received) -> None:
    gpus = [g["uuid"] for g in lab.show("n1")["inventory"]["gpus"]]
    lab.bc("cmd", "run", "n1", "inventory.refresh")  # a command to count
    received.wait(lambda r: _exported(r, len(gpus)), timeout=30)
    (_, _, resource), *_ = received.points("bc.agent.journal.size")
    assert (resource["service.name"], resource["bc.node_id"], resource["site"]) == ("bc-node", "n1", "lab")
    kinds = {(a["bc.lane"], a["bc.kind"], a["bc.state"]) for a, _, _ in received.points("bc.agent.commands")}
    assert any(k == "inventory.refresh" and s == "succeeded" for _, k, s in kinds), kinds
    assert {a["gpu.uuid"] for a, _, _ in received.points("bc.gpu.power")} == set(gpus)
    sections = {a["bc.section"] for a, _, _ in received.points("bc.agent.converge.duration")}
    assert {"devices", "telemetry"} <= sections, sections
    assert {a["ecc.counter"] for a, _, _ in received.points("bc.gpu.ecc.errors")} == {"volatile", "aggregate"}


@pytest.mark.e2e
def test_a_node_exports_its_metrics_to_the_sections_endpoint_over_grpc_then_http(lab: Lab) -> None:
    bring_up(lab, {"n1": "hgx-h100-8"})
    with grpc_receiver() as (port, received):
        rollout(
            lab,
            {
                "otlp_endpoint": f"http://127.0.0.1:{port}",
                "export_interval_s": 1,
                "resource_attributes": {"site": "lab"},
            },
        )
        assert section_state(lab, "telemetry")["state"] == "CONVERGED"
        _check_node_export(lab, received)
    with http_receiver() as (port, received):
        rollout(
            lab,
            {
                "otlp_endpoint": f"http://127.0.0.1:{port}",
                "protocol": "http/protobuf",
                "export_interval_s": 1,
                "resource_attributes": {"site": "lab"},
            },
        )
        _check_node_export(lab, received)
    assert_no_tracebacks(lab)


@pytest.mark.e2e
def test_an_endpoint_that_is_not_a_url_is_refused_in_one_sentence_and_changes_nothing(lab: Lab) -> None:
    """The control plane applies the node's own rule (bc.otel.config) before it stores a spec: a section
    the node would fail never leaves it. The node's side of the rule (the section FAILED `BadEndpoint`,
    the export stopped, the rest converged) is tests/integration/test_otlp_export.py's."""
    before = bring_up(lab, {"n1": "hgx-h100-8"})["n1"]
    path = lab.root / "telemetry.json"
    for section, why in [
        ({"otlp_endpoint": "collector 4317"}, "must be an http or https URL"),
        ({"otlp_endpoint": "http://collector:4317/v1/metrics", "protocol": "grpc"}, "gRPC takes no path"),
        ({"otlp_endpoint": "http://collector:4317", "protocol": "thrift"}, "neither grpc nor http/protobuf"),
    ]:
        path.write_text(json.dumps(section))
        out = lab.run("jobs", "run", "rollout", "--section", "telemetry", "--file", str(path), "--nodes", "n1")
        assert out.returncode != 0 and why in out.stderr and "Traceback" not in out.stderr, (section, out)
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert lab.show("n1")["generation"] == before["generation"], "nothing was stored"
    assert lab.bc("jobs", "list") == []
    assert_no_tracebacks(lab)


@pytest.mark.e2e
def test_bc_serve_exports_its_own_metrics(lab: Lab) -> None:
    with grpc_receiver() as (port, received):
        lab.spawn(
            "serve",
            "serve",
            "--data-dir",
            str(lab.server_dir),
            "--listen",
            lab.address,
            "--heartbeat-interval",
            str(HEARTBEAT_S),
            "--otlp-endpoint",
            f"http://127.0.0.1:{port}",
            "--otlp-interval",
            "1",
            port=lab.port,
        )
        lab.join("n1")
        lab.node("n1")
        lab.wait_converged("n1")

        def connected(r: Received) -> bool:
            return any(a == {"bc.state": "connected"} and v == 1 for a, v, _ in r.points("bc.server.nodes")) and any(
                v == 1 for _, v, _ in r.points("bc.server.sessions")
            )

        received.wait(connected, timeout=30)
        assert {"bc.server.sessions", "bc.server.nodes", "bc.server.events.published", "bc.server.clock.offset"} <= (
            received.names()
        )
        (_, _, resource), *_ = received.points("bc.server.sessions")
        assert resource["service.name"] == "bc-serve"
    assert_no_tracebacks(lab)


@pytest.mark.e2e
def test_bad_otlp_flags_are_one_sentence(lab: Lab) -> None:
    out = lab.run("serve", "--data-dir", str(lab.server_dir), "--otlp-endpoint", "collector:4317")
    assert out.returncode != 0 and "is not a URL" in out.stderr and "Traceback" not in out.stderr, out
    assert not (lab.server_dir / "bc.db").exists(), "nothing was started"
    out = lab.run("node", "--data-dir", str(lab.root / "x"), "--fake-fault", "xid79:0")
    assert out.returncode != 0 and "--fake-fault needs --fake-hw" in out.stderr, out
    out = lab.run("node", "--data-dir", str(lab.root / "x"), "--fake-hw", "hgx-h100-8", "--fake-fault", "melt:0")
    assert out.returncode != 0 and "unknown fault kind" in out.stderr, out
