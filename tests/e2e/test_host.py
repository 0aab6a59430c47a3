"""The `host` section end to end: `bc jobs run rollout --section host` over fake nodes, as an operator runs it.

* a rollout of sysctl, kernel-modules and hugepages units succeeds on three nodes of three profiles: each
  node's drop-ins appear under its host root (`<data dir>/host-root`), its fake runner recorded the
  commands, and nothing on this machine's /etc changed;
* a rollout of a MIG layout stops at the node whose GPUs have no MIG (an L4) with the unit's reason,
  after the MIG node before it made the layout (its inventory in `bc nodes show` has the new instances)
  and removed the units the new section no longer names; the node after it keeps its spec;
* a `gpu.mig` reservation of every MIG instance on that node then holds the two new ones too: its CDI
  spec (valid by the CDI schema) names their GPU's node and their capability nodes;
* a node run with `--no-host-units` answers a host section UNSUPPORTED (`HostManagedExternally`) and still
  observes the generation.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.converge.host_ops import FAKE_COMMANDS_FILE, FakeRunner

from .harness import HEARTBEAT_S, Lab, assert_no_tracebacks, cdi_problems, job_brief, read_cdi

pytestmark = pytest.mark.e2e

PROFILES = {"n1": "hgx-h100-8", "n2": "mig-a100-4", "n3": "l4-slots-4"}
SYSCTL = "etc/sysctl.d/90-bc-sysctl.conf"
MODULES = "etc/modules-load.d/bc-kernel-modules.conf"
HP_2M = "sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"
REAL = [Path("/etc/sysctl.d"), Path("/etc/modules-load.d"), Path("/etc/systemd/system")]


def tree(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    return {
        str(p): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir" for p in sorted(path.rglob("*"))
    }


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    lab = Lab(tmp_path_factory.mktemp("host"))
    try:
        lab.serve()
        for n, profile in PROFILES.items():
            lab.join(n)
            lab.node(n, profile)
        lab.join("n4")
        lab.spawn(
            "node-n4",
            "node",
            "--data-dir",
            str(lab.node_dir("n4")),
            "--fake-hw",
            "hgx-h100-8",
            "--heartbeat-interval",
            str(HEARTBEAT_S),
            "--no-host-units",
        )
        for n in (*PROFILES, "n4"):
            lab.wait_converged(n)
        yield lab
        print(lab.dump_logs())
    finally:
        lab.close()


def host_file(lab: Lab, node: str, rel: str) -> Path:
    return lab.node_dir(node) / "host-root" / rel


def section(lab: Lab, name: str, units: dict[str, Any]) -> Path:
    path = lab.root / f"{name}.json"
    path.write_text(json.dumps({"units": [{"name": k, "settings_json": json.dumps(v)} for k, v in units.items()]}))
    return path


def host_status(doc: dict[str, Any]) -> dict[str, Any]:
    (s,) = [s for s in doc["sections"] if s["section"] == "host"]
    assert isinstance(s, dict)
    return s


def test_a_host_rollout_applies_its_units_on_every_node(lab: Lab) -> None:
    real_before = {p: tree(p) for p in REAL}
    units = {
        "sysctl": {"vm.max_map_count": 262144},
        "kernel-modules": {"modules": ["vfio_pci"]},
        "hugepages": {"pages": [{"size": "2M", "count": 256}]},
    }
    generations = {n: int(lab.show(n)["generation"]) for n in PROFILES}
    r = lab.run(
        "jobs", "run", "rollout", "--section", "host", "--file", str(section(lab, "host1", units)),
        "--nodes", "n1,n2,n3", "--json", timeout=90,
    )  # fmt: skip
    assert r.returncode == 0, f"exited {r.returncode}: {r.stdout} {r.stderr}"
    (dag,) = [j for j in lab.bc("jobs", "list") if j["template"] == "rollout"]
    assert dag["state"] == "done", job_brief(dag)
    for n in PROFILES:
        doc = lab.wait_converged(n, generations[n] + 1)
        assert host_status(doc)["state"] == "CONVERGED", doc["sections"]
        assert host_file(lab, n, SYSCTL).read_text().splitlines()[1:] == ["vm.max_map_count = 262144"]
        assert host_file(lab, n, MODULES).read_text().splitlines()[1:] == ["vfio_pci"]
        assert host_file(lab, n, HP_2M).read_text().strip() == "256"
        ran = FakeRunner.read_log(lab.node_dir(n) / FAKE_COMMANDS_FILE)
        assert ran == [["sysctl", "-p", str(host_file(lab, n, SYSCTL))], ["modprobe", "vfio_pci"]], ran
    assert {p: tree(p) for p in REAL} == real_before, "a fake node changed this machine's /etc"
    assert_no_tracebacks(lab)


def test_a_mig_rollout_stops_at_the_node_whose_unit_fails(lab: Lab) -> None:
    mig = {"mig": {"gpus": [{"gpu": 2, "instances": ["3g.40gb", "3g.40gb"]}]}}
    generations = {n: int(lab.show(n)["generation"]) for n in PROFILES}
    r = lab.run(
        "jobs", "run", "rollout", "--section", "host", "--file", str(section(lab, "mig", mig)),
        "--nodes", "n2,n3,n1", timeout=90,
    )  # fmt: skip
    assert r.returncode == 8, f"exited {r.returncode}: {r.stdout} {r.stderr}"
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "node n3 answered host FAILED (UnitInvalid)" in errors[0], r.stderr

    jobs = [j for j in lab.bc("jobs", "list") if j["template"] == "rollout"]
    dag = max(jobs, key=lambda j: str(j["id"]))
    states = {x["id"]: x["state"] for x in dag["nodes"]}
    assert (states["patch:n2"], states["patch:n3"], states["patch:n1"]) == ("done", "failed", "cancelled"), job_brief(
        dag
    )
    n3 = lab.wait_converged("n3", generations["n3"] + 1)  # a terminal failure is observed
    assert "NVIDIA L4 does not support MIG" in host_status(n3)["message"]
    others = {x["section"]: x["state"] for x in n3["sections"] if x["section"] != "host"}
    assert set(others.values()) == {"CONVERGED"}, others  # the other sections still converge
    assert int(lab.show("n1")["generation"]) == generations["n1"]

    n2 = lab.wait_converged("n2", generations["n2"] + 1)
    assert host_status(n2)["state"] == "CONVERGED"
    gpu2 = n2["inventory"]["gpus"][2]
    assert gpu2["mig_enabled"] and [m["profile"] for m in gpu2["mig_instances"]] == ["3g.40gb", "3g.40gb"]
    assert not host_file(lab, "n2", SYSCTL).exists() and not host_file(lab, "n2", MODULES).exists()
    assert host_file(lab, "n2", HP_2M).read_text().strip() == "0"
    ran = FakeRunner.read_log(lab.node_dir("n2") / FAKE_COMMANDS_FILE)
    assert ["nvidia-smi", "mig", "-i", "2", "-cgi", "3g.40gb,3g.40gb", "-C"] in ran
    assert_no_tracebacks(lab)


def test_a_mig_reservation_holds_the_instances_the_layout_made(lab: Lab) -> None:
    inv = lab.show("n2")["inventory"]
    gpu2 = inv["gpus"][2]
    assert [m["profile"] for m in gpu2.get("mig_instances", [])] == ["3g.40gb", "3g.40gb"], "run after the MIG rollout"
    count = sum(len(g.get("mig_instances", [])) for g in inv["gpus"])
    res = lab.bc("reserve", "--gpus", str(count), "--class", "gpu.mig", "--node", "n2")
    lab.wait_reservation_state(res["id"], "active")
    path = lab.cdi_path("n2", res["allocation_id"])
    doc = lab.wait_for(f"the CDI spec {path.name}", lambda: read_cdi(path))
    assert not cdi_problems(doc), cdi_problems(doc)
    new = [d for d in doc["devices"] if d["annotations"]["bc.dev/device-id"].startswith(gpu2["uuid"] + "/")]
    assert len(new) == 2, [d["annotations"] for d in doc["devices"]]
    for d in new:
        paths = [n["path"] for n in d["containerEdits"]["deviceNodes"]]
        assert paths[0] == "/dev/nvidia2" and len(paths) == 3, paths
        assert all(p.startswith("/dev/nvidia-caps/nvidia-cap") for p in paths[1:]), paths
    spec_nodes = [n["path"] for n in doc["containerEdits"]["deviceNodes"]]
    assert spec_nodes == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"]
    lab.bc("release", res["id"], json=False)
    lab.wait_for("the hold released", lambda: not path.exists())
    assert_no_tracebacks(lab)


def test_a_node_with_no_host_units_answers_host_managed_externally(lab: Lab) -> None:
    generation = int(lab.show("n4")["generation"])
    units = {"sysctl": {"vm.max_map_count": 262144}}
    lab.bc("spec", "set", "n4", "host", "@" + str(section(lab, "n4", units)))
    doc = lab.wait_converged("n4", generation + 1)  # UNSUPPORTED does not hold observed_generation back
    s = host_status(doc)
    assert (s["state"], s["reason"]) == ("UNSUPPORTED", "HostManagedExternally"), s
    assert not (lab.node_dir("n4") / "host-root" / SYSCTL).exists()
    assert not (lab.node_dir("n4") / FAKE_COMMANDS_FILE).exists()


def test_settings_bad_on_every_host_are_refused_before_anything_is_stored(lab: Lab) -> None:
    before = lab.bc("spec", "show", "n1")
    for units, mentions in (
        ({"sysctl": {"net/ipv4/ip_forward": 1}}, "has a '/' or '..'"),
        ({"sysctl": {"vm.swappiness": "10\n"}}, "U+000A"),
        ({"hugepages": {"pages": [{"size": "2MB", "count": 1}]}}, "is not like 2M, 1G or 2048kB"),
    ):
        r = lab.run("spec", "set", "n1", "host", "@" + str(section(lab, "bad", units)))
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), r.stderr
        assert mentions in lines[0] and "Traceback" not in r.stderr, lines[0]
    assert lab.bc("spec", "show", "n1") == before
