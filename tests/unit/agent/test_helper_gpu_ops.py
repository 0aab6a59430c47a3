"""agent.helper.gpu_ops: the GPU node units' operations, checked by the helper before anything is touched.

The examples show each operation's rule; the Hypothesis properties show that no request, however built,
plans a path outside the helper's root or one taken from the request, runs an argv that is not one
agent.converge.gpu_packages builds, or escapes as anything but `Refused`, and that no refusal carries a
Kubernetes token.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.converge import gpu_packages, kubeadm
from agent.helper import ops
from agent.helper.ops import Layout, Refused, Run
from agent.helper.plans import KubeadmJoin, MergeConfig

ROOT = Path("/h")
LAY = Layout(ROOT)
TOKEN = "abcdef.0123456789abcdef"
HASH = "sha256:" + "ab" * 32


def req(op: str, **args: Any) -> dict[str, Any]:
    return {"v": ops.VERSION, "op": op, **args}


def refused(request: Any, match: str = ".") -> str:
    with pytest.raises(Refused, match=match) as e:
        ops.plan(request, LAY)
    return str(e.value)


def package(**kw: Any) -> dict[str, Any]:
    args = {"manager": "apt", "action": "install", "unit": "nvidia-driver", "branch": "550", "version": ""}
    return req("host.package", **{**args, **kw})


def test_a_package_install_is_the_argv_the_units_build() -> None:
    plan = ops.plan(package(version="550.127.05"), LAY)
    want = gpu_packages.install_argv("apt", gpu_packages.Package("nvidia-driver", "550", "550.127.05"))
    assert [e.argv for e in plan if isinstance(e, Run)] == [tuple(a) for a in want]
    assert all(isinstance(e, Run) and e.timeout_s >= 1800 for e in plan)
    (unhold,) = ops.plan(package(action="release", unit="fabric-manager"), LAY)
    assert unhold == Run(("apt-mark", "unhold", "nvidia-fabricmanager-550"), 1800.0)
    assert ops.plan(package(manager="dnf", action="release"), LAY) == ()
    (toolkit,) = ops.plan(package(manager="dnf", unit="container-toolkit", branch="", version="1.17.3"), LAY)
    assert toolkit == Run(("dnf", "install", "-y", "-q", "nvidia-container-toolkit-1.17.3"), 1800.0)


@pytest.mark.parametrize(
    ("kw", "why"),
    [
        ({"unit": "openssh-server"}, "is not nvidia-driver"),
        ({"manager": "pacman"}, "is not apt or dnf"),
        ({"action": "remove"}, "is not install or release"),
        ({"branch": "550; rm -rf /"}, "at most 8"),
        ({"branch": "55x"}, "branch must be"),
        ({"version": "550.1 -o APT::X=1"}, "at most 24|driver version"),
        ({"version": "560.35.03"}, "not of branch 550"),
        ({"unit": "container-toolkit", "branch": "550"}, "has no branch"),
        ({"extra": 1}, "takes no extra"),
    ],
)
def test_a_package_request_outside_the_table_is_refused(kw: dict[str, Any], why: str) -> None:
    refused(package(**kw), why)


def test_runtime_config_is_the_helpers_own_file_and_cdi_dir() -> None:
    (m,) = ops.plan(req("host.runtime.config", runtime="docker", present=True), LAY)
    assert m == MergeConfig(ROOT / "etc/docker/daemon.json", "docker", ("/h/etc/cdi", "/etc/cdi", "/var/run/cdi"), True)
    refused(req("host.runtime.config", runtime="podman", present=True), "is not one of")
    refused(req("host.runtime.config", runtime="docker", present="yes"), "true or false")
    refused(req("host.runtime.config", runtime="docker", present=True, path="/etc/shadow"), "takes no path")


def join(**kw: Any) -> dict[str, Any]:
    return req("host.kubeadm.join", **{"api_server": "10.0.0.1:6443", "token": TOKEN, "ca_cert_hashes": [HASH], **kw})


def test_a_join_is_rendered_by_the_helper_and_checked_against_roots_list() -> None:
    (j,) = ops.plan(join(labels={"bc.dev/pool": "a"}), LAY)
    assert isinstance(j, KubeadmJoin)
    assert j.config == ROOT / kubeadm.JOIN_CONFIG and j.clusters == ROOT / "etc/bc/kubernetes-clusters"
    assert j.argv == ("kubeadm", "join", "--config", str(ROOT / kubeadm.JOIN_CONFIG))
    assert (j.api_server, j.ca_cert_hashes) == ("10.0.0.1:6443", (HASH,))
    assert b'token: "abcdef.0123456789abcdef"' in j.data and TOKEN not in repr(j)
    for bad in (join(token="x"), join(api_server="evil"), join(ca_cert_hashes=["md5:x"]), join(labels={"k": "a b"})):
        assert "0123456789abcdef" not in refused(bad)


@pytest.mark.parametrize(
    "argv",
    [
        ["modprobe", "-r", "nvidia_drm", "nvidia_modeset", "nvidia_uvm", "nvidia"],
        ["modprobe", "-a", "nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm"],
        ["systemctl", "enable", "nvidia-fabricmanager.service"],
        ["systemctl", "restart", "nvidia-fabricmanager.service"],
        ["systemctl", "disable", "--now", "nvidia-fabricmanager.service"],
        ["systemctl", "restart", "containerd.service"],
        ["systemctl", "restart", "docker.service"],
        ["systemctl", "restart", "crio.service"],
        ["kubeadm", "reset", "--force"],
    ],
)
def test_the_units_fixed_commands_run_as_they_are(argv: list[str]) -> None:
    assert ops.plan(req("host.run", argv=argv), LAY) == (Run(tuple(argv)),)


@pytest.mark.parametrize(
    "argv",
    [
        ["modprobe", "-r", "nvidia"],
        ["systemctl", "restart", "sshd.service"],
        ["systemctl", "stop", "nvidia-fabricmanager.service"],
        ["kubeadm", "join", "--config", "/tmp/x"],
        ["kubeadm", "reset", "--force", "--kubeconfig", "/tmp/x"],
        ["apt-get", "install", "-y", "nvidia-driver-550"],
    ],
)
def test_anything_else_is_refused(argv: list[str]) -> None:
    refused(req("host.run", argv=argv), "not one the host units run")


TEXT = st.text(max_size=30) | st.sampled_from(
    ["550", "550.127.05", "apt", "dnf", "install", "release", "nvidia-driver"]
)
ANY = (
    st.none()
    | st.booleans()
    | st.integers()
    | TEXT
    | st.lists(TEXT, max_size=3)
    | st.dictionaries(TEXT, TEXT, max_size=3)
)
FIELDS = st.sampled_from(
    [
        "manager",
        "action",
        "unit",
        "branch",
        "version",
        "runtime",
        "present",
        "api_server",
        "token",
        "ca_cert_hashes",
        "labels",
        "path",
    ]
)


@settings(max_examples=400)
@given(
    st.sampled_from(["host.package", "host.runtime.config", "host.kubeadm.join"]),
    st.dictionaries(FIELDS, ANY, max_size=6),
)
def test_no_request_plans_anything_but_what_the_table_builds(op: str, args: dict[str, Any]) -> None:
    try:
        plan = ops.plan(req(op, **args), LAY)
    except Refused as e:
        assert "0123456789abcdef" not in str(e)
        return
    for effect in plan:
        if isinstance(effect, Run):
            assert effect.argv[0] in ("env", "apt-mark", "dnf")
            assert all(" " not in a and not a.startswith("/") for a in effect.argv)
        elif isinstance(effect, MergeConfig):
            assert effect.path.is_relative_to(ROOT) and effect.cdi_dirs[0] == str(LAY.cdi_dir)
        else:
            assert isinstance(effect, KubeadmJoin) and effect.config == ROOT / kubeadm.JOIN_CONFIG
