"""Which qemu runtime a node builds (agent.app.instance_runtime): a root agent confines its VMMs itself, an
unprivileged one with `--helper-socket` starts them through bc helper (HelperVmm), one with neither runs them as
its own user and says so; the instances' network rules are then root's to load (HelperNetwork), or its own."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from agent.app import instance_network, instance_runtime
from agent.helper.vm_client import HelperNetwork, HelperVmm
from agent.instances.net.guard import InstanceNetwork
from agent.instances.qemu import QemuRuntime
from agent.offload import to_thread


@pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None, reason="qemu is not installed")
def test_an_unprivileged_agent_with_a_helper_starts_its_vmms_through_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    host = SimpleNamespace(capabilities=SimpleNamespace(touches_host=True))
    sock = tmp_path / "helper.sock"
    through = instance_runtime(tmp_path, host, to_thread, ("kvm", "tcg"), helper_socket=sock, is_root=False)  # type: ignore[arg-type]
    assert isinstance(through, QemuRuntime) and isinstance(through.steps, HelperVmm)
    assert through.steps.client.socket_path == sock and not through.confine
    alone = instance_runtime(tmp_path, host, to_thread, ("kvm", "tcg"), is_root=False)  # type: ignore[arg-type]
    assert isinstance(alone, QemuRuntime) and alone.steps is None and not alone.confine
    assert "event=instance.vmm-unconfined" in caplog.text
    as_root = instance_runtime(tmp_path, host, to_thread, ("kvm", "tcg"), helper_socket=sock, is_root=True)  # type: ignore[arg-type]
    assert isinstance(as_root, QemuRuntime) and as_root.steps is None and as_root.confine


@pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None, reason="qemu is not installed")
def test_the_network_rules_are_root_s_to_load_where_the_vmms_start_through_the_helper(tmp_path: Path) -> None:
    host = SimpleNamespace(capabilities=SimpleNamespace(touches_host=True))
    sock = tmp_path / "helper.sock"

    async def restored(body: dict[str, object]) -> None: ...

    through = instance_runtime(tmp_path, host, to_thread, ("kvm", "tcg"), helper_socket=sock, is_root=False)  # type: ignore[arg-type]
    net = instance_network(through, tmp_path, to_thread, restored)
    assert isinstance(net, HelperNetwork) and net.client.socket_path == sock
    assert net.record == tmp_path / "instance-net.json"
    as_root = instance_runtime(tmp_path, host, to_thread, ("kvm", "tcg"), helper_socket=sock, is_root=True)  # type: ignore[arg-type]
    own = instance_network(as_root, tmp_path, to_thread, restored)
    assert isinstance(own, InstanceNetwork) and not isinstance(own, HelperNetwork)
    fake = SimpleNamespace(capabilities=SimpleNamespace(touches_host=False))
    assert (
        instance_network(instance_runtime(tmp_path, fake, to_thread, ("tcg",)), tmp_path, to_thread, restored) is None
    )  # type: ignore[arg-type]
