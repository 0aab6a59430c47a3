"""Where the libvirt runtime is turned on: beside qemu on a real host whose libvirt answers, never on fake hardware;
each runtime by its name (the spec's `runtime` picks one, and the Hello advertises `instances.<name>`)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from agent.app import AgentOptions, instance_runtimes, libvirt_runtimes
from agent.instances.fake import FakeRuntime
from agent.instances.libvirt import LibvirtRuntime, domain_type
from agent.offload import inline


def test_every_runtime_by_its_name() -> None:
    qemu = FakeRuntime(Path("/nonexistent/fake.json"), inline)
    lv = LibvirtRuntime(object(), "qemu:///system", Path("/nonexistent"), inline)
    parts = SimpleNamespace(instances=qemu, more_instances=(lv,))
    assert instance_runtimes(parts) == {"qemu": qemu, "libvirt": lv}  # type: ignore[arg-type]
    assert instance_runtimes(SimpleNamespace(instances=None, more_instances=(lv,))) == {"libvirt": lv}  # type: ignore[arg-type]
    assert instance_runtimes(SimpleNamespace(instances=None, more_instances=())) == {}  # type: ignore[arg-type]


def test_fake_hardware_or_the_fake_runtime_never_probes_libvirt(tmp_path: Path) -> None:
    hw = SimpleNamespace(capabilities=SimpleNamespace(touches_host=False))
    assert libvirt_runtimes(tmp_path, hw, AgentOptions(data_dir=tmp_path)) == ()  # type: ignore[arg-type]
    real = SimpleNamespace(capabilities=SimpleNamespace(touches_host=True))
    lab = AgentOptions(data_dir=tmp_path, instance_runtime="fake")
    assert libvirt_runtimes(tmp_path, real, lab) == ()  # type: ignore[arg-type]


def test_tcg_asked_first_is_the_qemu_domain_type() -> None:
    assert domain_type(("tcg",)) == "qemu"
    assert domain_type(()) == "qemu"
