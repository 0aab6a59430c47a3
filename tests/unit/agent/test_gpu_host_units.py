"""The GPU node host units' pure rules: which commands and files for which host state, and what condition.

nvidia-driver, fabric-manager, container-toolkit and kubernetes drive tools that are not installable on this
machine (NVIDIA's packages, nvidia-container-toolkit, kubeadm): their argv, the runtime configuration files
and the kubeadm JoinConfiguration are checked here as data, and through the fake runner in
tests/integration/test_host_gpu_units.py.
"""

from __future__ import annotations

import datetime
import json
import re
import tomllib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.converge import gpu_packages, kubeadm, runtime_config
from agent.converge.gpu_packages import APT, DNF, Package, install_argv, package_manager, release_argv
from agent.converge.host_units.base import Record
from agent.converge.host_units.fabric_manager import FmState, nvswitches
from agent.converge.host_units.fabric_manager import verdict as fm_verdict
from agent.converge.host_units.kubernetes import cluster, plan
from agent.converge.host_units.nvidia_driver import DriverState, mismatch, needs_install, reload_due, verdict
from bc.protocol import root_equiv
from bc.protocol.host_units import (
    MAX_LABELS,
    Driver,
    Join,
    UnitInvalid,
    label_problem,
    parse_driver,
    parse_join,
    parse_toolkit,
    with_node_labels,
)
from bc.protocol.pb import spec_pb2

TOKEN = "abcdef.0123456789abcdef"
HASH = "sha256:" + "ab" * 32


# -- the package manager and the argv --------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "manager"),
    [
        ('ID=ubuntu\nID_LIKE=debian\nVERSION_ID="24.04"\n', APT),
        ("ID=debian\n", APT),
        ('ID="rocky"\nID_LIKE="rhel centos fedora"\n', DNF),
        ("ID=amzn\n", DNF),
        ("ID=arch\n", None),
        ("", None),
    ],
)
def test_the_package_manager_comes_from_os_release(text: str, manager: str | None) -> None:
    assert package_manager(text) == manager


def test_a_driver_version_is_installed_held_and_later_let_go() -> None:
    p = Package("nvidia-driver", "550", "550.127.05")
    install, hold = install_argv(APT, p)
    assert install[:3] == ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get"]
    assert install[-1] == "nvidia-driver-550=550.127.05-*" and "--allow-change-held-packages" in install
    assert hold == ["apt-mark", "hold", "nvidia-driver-550"]
    assert release_argv(APT, p) == [["apt-mark", "unhold", "nvidia-driver-550"]]
    assert install_argv(DNF, p) == [["dnf", "install", "-y", "-q", "nvidia-driver-550.127.05"]]
    assert install_argv(DNF, Package("nvidia-driver", "550")) == [["dnf", "install", "-y", "-q", "nvidia-driver-550.*"]]
    assert install_argv(APT, Package("fabric-manager", "550"))[0][-1] == "nvidia-fabricmanager-550"
    assert release_argv(DNF, p) == []


DRIVERS = st.builds(
    lambda branch, rest, activate: parse_driver({"version": f"{branch}.{rest}", "activate": activate}),
    st.integers(100, 9999).map(str),
    st.from_regex(r"[0-9]{1,4}(\.[0-9]{1,4})?", fullmatch=True),
    st.sampled_from(["reboot", "reload"]),
)


@given(DRIVERS, st.sampled_from([APT, DNF]), st.sampled_from(gpu_packages.UNIT_PACKAGES[:2]))
def test_every_valid_version_makes_argv_of_plain_tokens(d: Driver, manager: str, unit: str) -> None:
    for argv in install_argv(manager, Package(unit, d.branch, d.version)):
        assert all(re.fullmatch(r"[A-Za-z0-9_.=:*+-]+", a) for a in argv), argv
        assert any(d.version in a for a in argv) or argv[0] == "apt-mark"


# -- nvidia-driver ---------------------------------------------------------------------------------

WANT = Driver("550", "550.127.05")


@pytest.mark.parametrize(
    ("want", "state", "held", "install", "reload", "reason"),
    [
        (WANT, DriverState("550.127.05", "550.127.05"), False, False, False, "Matches"),
        (WANT, DriverState("550.90.07", "550.90.07"), False, True, False, "InstallFailed"),
        (WANT, DriverState("", ""), False, True, False, "NoDriverLoaded"),
        (WANT, DriverState("550.127.05", "550.90.07"), False, False, False, "RebootRequired"),
        (
            Driver("550", "550.127.05", "reload"),
            DriverState("550.127.05", "550.90.07"),
            False,
            False,
            True,
            "ReloadWaiting",
        ),
        (
            Driver("550", "550.127.05", "reload"),
            DriverState("550.127.05", "550.90.07"),
            True,
            False,
            False,
            "ReloadWaiting",
        ),
        (Driver("550"), DriverState("550.127.05", "550.127.05"), False, False, False, "Matches"),
        (Driver("550"), DriverState("550.127.05", "550.90.07"), False, False, False, "RebootRequired"),
        (Driver("560"), DriverState("550.90.07", "550.90.07"), False, True, False, "InstallFailed"),
    ],
)
def test_the_driver_rules(
    want: Driver, state: DriverState, held: bool, install: bool, reload: bool, reason: str
) -> None:
    assert needs_install(want, state) is install
    assert reload_due(want, state, held) is reload  # never while a GPU is held
    v = verdict(want, state, held, None)
    assert (v.type, v.reason) == ("DriverMismatch", reason)
    assert v.status == ("False" if reason == "Matches" else "True")
    assert mismatch(want, state) is (reason != "Matches")


def test_a_failed_install_is_the_conditions_reason_and_message() -> None:
    v = verdict(WANT, DriverState("550.90.07", "550.90.07"), False, "apt-get exited 100: E: Unable to locate")
    assert (v.status, v.reason, v.message) == ("True", "InstallFailed", "apt-get exited 100: E: Unable to locate")


# -- fabric-manager --------------------------------------------------------------------------------


def test_nvswitches_are_nvidia_pci_bridges() -> None:
    devices = {
        "0000:05:00.0": ("0x10de\n", "0x068000\n"),
        "0000:18:00.0": ("0x10de", "0x030200"),  # a GPU
        "0000:00:01.0": ("0x8086", "0x068000"),  # someone else's bridge
    }
    assert nvswitches(devices) == ("0000:05:00.0",)


@pytest.mark.parametrize(
    ("state", "error", "status", "reason"),
    [
        (FmState((), "", False, "550.90.07"), None, "True", "NotNeeded"),
        (FmState(("s",), "550.127.05", True, "550.127.05"), None, "True", "Running"),
        (FmState(("s",), "", False, "550.127.05"), None, "False", "NotInstalled"),
        (FmState(("s",), "550.127.05", False, "550.90.07"), None, "False", "VersionMismatch"),
        (FmState(("s",), "550.127.05", False, "550.127.05"), None, "False", "NotRunning"),
        (FmState(("s",), "550.127.05", False, "550.127.05"), "systemctl exited 1", "False", "ApplyFailed"),
    ],
)
def test_the_fabric_manager_condition(state: FmState, error: str | None, status: str, reason: str) -> None:
    v = fm_verdict(WANT, state, error)
    assert (v.type, v.status, v.reason) == ("FabricManagerReady", status, reason)


# -- kubernetes ------------------------------------------------------------------------------------

JOIN = Join("10.0.0.1:6443", TOKEN, (HASH,), (("bc.dev/pool", "a"), ("tier", "gpu")))


def test_a_join_is_planned_only_where_the_node_is_not_in_the_specs_cluster() -> None:
    record = Record("kubernetes", "sha256:x", undo={"cluster": cluster(JOIN)})
    assert plan(JOIN, joined=False, record=None) == ["join"]
    assert plan(JOIN, joined=True, record=None) == []  # joined already (by hand): kept
    assert plan(JOIN, joined=True, record=record) == []
    other = Record("kubernetes", "sha256:x", undo={"cluster": {"api_server": "10.9.9.9:6443", "ca_cert_hashes": []}})
    assert plan(JOIN, joined=True, record=other) == ["reset", "join"]
    new_token = Join(JOIN.api_server, "zzzzzz.0123456789abcdef", JOIN.ca_cert_hashes, ())
    assert plan(new_token, joined=True, record=record) == []  # a token or labels alone: not another cluster


def test_the_join_configuration_carries_the_token_and_labels_and_redact_takes_it_out() -> None:
    text = kubeadm.render_join(JOIN).decode()
    assert "kind: JoinConfiguration" in text
    assert f'    token: "{TOKEN}"' in text and f'    - "{HASH}"' in text
    assert 'node-labels: "bc.dev/pool=a,tier=gpu"' in text
    said = f"kubeadm join failed: token {TOKEN} rejected; secret 0123456789abcdef"
    assert TOKEN not in kubeadm.redact(said, JOIN) and "0123456789abcdef" not in kubeadm.redact(said, JOIN)
    assert TOKEN not in repr(JOIN)
    assert kubeadm.join_argv("/r/etc/kubernetes/bc-join.yaml") == [
        "kubeadm",
        "join",
        "--config",
        "/r/etc/kubernetes/bc-join.yaml",
    ]


# -- runtime configuration -------------------------------------------------------------------------

DIRS = runtime_config.cdi_dirs("/var/lib/bc/cdi")
CONTAINERD_V2 = """# the operator's
version = 2
root = "/var/lib/containerd"

[plugins."io.containerd.grpc.v1.cri".containerd]
snapshotter = "overlayfs"
default_runtime_name = "runc"

[plugins."io.containerd.grpc.v1.cri".registry.mirrors."docker.io"]
endpoint = ["https://mirror.example"]
"""


def test_containerd_gets_cdi_and_keeps_the_operators_settings() -> None:
    text = runtime_config.merged("containerd", CONTAINERD_V2, DIRS, True)
    assert text is not None
    doc = tomllib.loads(text)
    cri = doc["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["enable_cdi"] is True and cri["cdi_spec_dirs"] == ["/var/lib/bc/cdi", "/etc/cdi", "/var/run/cdi"]
    assert cri["containerd"] == {"snapshotter": "overlayfs", "default_runtime_name": "runc"}
    assert cri["registry"]["mirrors"]["docker.io"]["endpoint"] == ["https://mirror.example"]
    assert doc["root"] == "/var/lib/containerd" and doc["version"] == 2
    assert runtime_config.merged("containerd", text, DIRS, True) == text  # idempotent
    back = runtime_config.merged("containerd", text, DIRS, False)
    assert back is not None and tomllib.loads(back) == tomllib.loads(CONTAINERD_V2)


@pytest.mark.parametrize(
    ("text", "plugin"),
    [
        ("version = 3\n", "io.containerd.cri.v1.runtime"),
        ('[plugins.cri]\nsandbox_image = "pause"\n', "cri"),
        (None, "io.containerd.grpc.v1.cri"),
    ],
)
def test_each_containerd_config_version_names_its_cri_plugin(text: str | None, plugin: str) -> None:
    out = runtime_config.merged("containerd", text, DIRS, True)
    assert out is not None and tomllib.loads(out)["plugins"][plugin]["enable_cdi"] is True
    back = runtime_config.merged("containerd", out, DIRS, False)  # nothing but a version left: no file
    if text in (None, "version = 3\n"):
        assert back is None
    else:
        assert tomllib.loads(back or "") == tomllib.loads(text or "")


def test_docker_daemon_json_gets_cdi_and_keeps_the_rest_and_a_broken_file_is_left_alone() -> None:
    operator = json.dumps({"log-driver": "journald", "features": {"buildkit": True}})
    text = runtime_config.merged("docker", operator, DIRS, True)
    assert text is not None
    doc = json.loads(text)
    assert doc["features"] == {"buildkit": True, "cdi": True} and doc["cdi-spec-dirs"] == DIRS
    assert doc["log-driver"] == "journald"
    assert json.loads(runtime_config.merged("docker", text, DIRS, False) or "") == json.loads(operator)
    assert runtime_config.merged("docker", None, DIRS, False) is None
    with pytest.raises(runtime_config.ConfigUnreadable, match="does not parse"):
        runtime_config.merged("docker", "{not json", DIRS, True)
    with pytest.raises(runtime_config.ConfigUnreadable, match="does not parse"):
        runtime_config.merged("containerd", "version = [", DIRS, True)


def test_the_toolkit_runs_in_cdi_mode_and_cri_o_gets_a_drop_in() -> None:
    shipped = '[nvidia-container-cli]\nldconfig = "@/sbin/ldconfig"\n\n[nvidia-container-runtime]\nlog-level = "info"\n'
    doc = tomllib.loads(runtime_config.merged("toolkit", shipped, DIRS, True) or "")
    assert doc["nvidia-container-runtime"]["mode"] == "cdi" and doc["nvidia-container-runtime"]["log-level"] == "info"
    assert doc["nvidia-container-runtime"]["modes"]["cdi"]["spec-dirs"] == DIRS
    assert doc["nvidia-container-cli"] == {"ldconfig": "@/sbin/ldconfig"}
    crio = tomllib.loads(runtime_config.merged("cri-o", None, DIRS, True) or "")
    assert crio == {"crio": {"runtime": {"cdi_spec_dirs": DIRS}}}
    assert runtime_config.merged("cri-o", "anything", DIRS, False) is None


KEYS = st.text(min_size=1, max_size=6)
SCALARS = (
    st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
    | st.datetimes(timezones=st.none() | st.just(datetime.UTC))
    | st.dates()
)
VALUES = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3), max_leaves=10
)


@given(st.dictionaries(KEYS, VALUES, max_size=5))
def test_dumps_writes_what_tomllib_reads_back(doc: dict[str, Any]) -> None:
    assert tomllib.loads(runtime_config.dumps(doc)) == doc


# -- validation and root-equivalence ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "why"),
    [
        ({"api_server": "10.0.0.1:6443", "token": "x" + TOKEN, "ca_cert_hashes": [HASH]}, "bootstrap token"),
        ({"api_server": "10.0.0.1", "token": TOKEN, "ca_cert_hashes": [HASH]}, "host:port"),
        ({"api_server": "a:6443", "token": TOKEN, "ca_cert_hashes": []}, "1 to 8"),
        (
            {"api_server": "a:6443", "token": TOKEN, "ca_cert_hashes": [HASH], "labels": {"kubernetes.io/x": "y"}},
            "may not",
        ),
        ({"api_server": "a:6443", "token": TOKEN, "ca_cert_hashes": [HASH], "labels": {"a": "b c"}}, "label value"),
    ],
)
def test_bad_join_settings_are_one_sentence_without_the_token(settings: dict[str, Any], why: str) -> None:
    with pytest.raises(UnitInvalid, match=why) as e:
        parse_join(settings)
    assert TOKEN not in str(e.value) and "0123456789abcdef" not in str(e.value)


@given(st.dictionaries(st.sampled_from(["api_server", "token", "ca_cert_hashes", "labels"]), st.text(max_size=30)))
def test_a_token_never_shows_in_a_refusal(settings: dict[str, Any]) -> None:
    settings["token"] = settings.get("token", "") + "0123456789abcdef"
    try:
        parse_join(settings)
    except UnitInvalid as e:
        assert "0123456789abcdef" not in str(e)


@pytest.mark.parametrize(
    ("settings", "why"),
    [
        ({"branch": "55"}, "driver branch"),
        ({"version": "550"}, "driver version"),
        ({"branch": "535", "version": "550.127.05"}, "not of branch 535"),
        ({"branch": "550", "activate": "now"}, "reboot or reload"),
        ({"branch": "550", "open": True}, "unknown setting"),
    ],
)
def test_bad_driver_settings(settings: dict[str, Any], why: str) -> None:
    with pytest.raises(UnitInvalid, match=why):
        parse_driver(settings)


def test_toolkit_settings() -> None:
    assert parse_toolkit({"runtimes": ["docker", "containerd"]}).runtimes == ("containerd", "docker")
    for bad in (
        {"runtimes": []},
        {"runtimes": ["podman"]},
        {"runtimes": ["docker", "docker"]},
        {"runtimes": ["docker"], "version": "x"},
    ):
        with pytest.raises(UnitInvalid, match="container-toolkit: "):
            parse_toolkit(bad)


def section(**units: object) -> spec_pb2.HostSection:
    return spec_pb2.HostSection(
        units=[spec_pb2.HostUnit(name=k, settings_json=json.dumps(v)) for k, v in units.items()]
    )


@pytest.mark.parametrize(
    ("unit", "settings"),
    [
        ("nvidia-driver", {"branch": "550"}),
        ("fabric-manager", {"branch": "550"}),
        ("container-toolkit", {"runtimes": ["containerd"]}),
        ("kubernetes", {"api_server": "a:6443", "token": TOKEN, "ca_cert_hashes": [HASH]}),
    ],
)
def test_installing_a_driver_or_package_or_joining_a_cluster_is_root_equivalent(unit: str, settings: object) -> None:
    why = root_equiv.changes("host", section(), section(**{unit: settings}))
    assert len(why) == 1 and why[0].startswith(f"{unit}: ")
    assert root_equiv.changes("host", section(**{unit: settings}), section(**{unit: settings})) == []
    assert root_equiv.changes("host", section(**{unit: settings}), section()) == []  # leaving the spec gives nothing


# -- bc's node labels in the join ---------------------------------------------------------------------------

label_keys = st.sampled_from(
    ["pool", "rack", "bc.dev/pool", "node-role.kubernetes.io/gpu", "kubernetes.io/arch", "x.k8s.io/y", "team"]
)


@given(
    own=st.dictionaries(label_keys, st.sampled_from(["a", "b", ""]), max_size=3),
    bc=st.dictionaries(label_keys, st.sampled_from(["a", "c"]), max_size=7),
)
def test_bc_labels_join_the_units_own_which_win_and_only_those_the_kubelet_may_set(
    own: dict[str, str], bc: dict[str, str]
) -> None:
    own = {k: v for k, v in own.items() if label_problem(k, v) is None}
    join = Join("a:6443", TOKEN, (HASH,), tuple(sorted(own.items())))
    merged, skipped = with_node_labels(join, bc)
    got = dict(merged.labels)
    assert {k: got[k] for k in own} == own  # the settings' own labels win on a shared key
    assert all(label_problem(k, v) is None for k, v in got.items())  # the helper's rule takes every one
    assert {k for k, _ in skipped} == {k for k in bc if k not in own and label_problem(k, bc[k]) is not None}
    assert set(got) == set(own) | {k for k in bc if label_problem(k, bc[k]) is None}
    assert merged.labels == tuple(sorted(got.items())) and with_node_labels(join, bc) == (merged, skipped)


def test_no_more_than_the_kubelets_64_labels_are_joined() -> None:
    join = Join("a:6443", TOKEN, (HASH,), (("own", "x"),))
    merged, skipped = with_node_labels(join, {f"l{i:02}": "v" for i in range(70)})
    assert len(merged.labels) == MAX_LABELS and len(skipped) == 7
    assert skipped[0] == ("l63", f"the join already has {MAX_LABELS} labels")
