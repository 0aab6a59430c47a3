"""agent.helper.server and client over a real unix socket in the test's directory (same uid: no root needed)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent import doctor
from agent.converge import env_files
from agent.converge.host_ops import FakeRunner
from agent.helper import checks
from agent.helper.client import HelperClient, HelperRefused, HelperUnavailable
from agent.helper.ops import Layout
from agent.helper.server import HelperServer


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[HelperClient, FakeRunner, Path]]:
    runner = FakeRunner()
    root = tmp_path / "root"
    server = await HelperServer(Layout(root), os.getuid(), run=runner).start(tmp_path / "h.sock")
    async with server:
        yield HelperClient(tmp_path / "h.sock"), runner, root
    server.close()
    await server.wait_closed()


async def test_hello_names_the_helpers_directories(served: tuple[HelperClient, FakeRunner, Path]) -> None:
    client, _, root = served
    hello = await client.call("helper.hello")
    assert hello["cdi_dir"] == str(root / "etc/cdi") and hello["version"] == 1


async def test_a_file_lands_and_a_refusal_says_helper_and_touches_nothing(
    served: tuple[HelperClient, FakeRunner, Path],
) -> None:
    client, runner, root = served
    data = env_files.env_bytes("a1", ["X=1"]).decode()
    await client.call("file.write", kind="allocation-env", allocation_id="a1", data=data)
    assert (root / "run/bc/allocations/bc-a1.env").read_text() == data
    with pytest.raises(HelperRefused, match=r"^helper: refused: slice.apply: slice 'sshd.service'"):
        await client.call("slice.apply", slice="sshd.service", limits={})
    await client.call("slice.remove", slice="bc-alloc-a1.slice")
    assert runner.calls == [["systemctl", "stop", "bc-alloc-a1.slice"], ["systemctl", "revert", "bc-alloc-a1.slice"]]


async def test_a_failed_command_comes_back_as_a_helper_error(served: tuple[HelperClient, FakeRunner, Path]) -> None:
    client, runner, _ = served
    runner.fail_on.append(("nvidia-smi",))
    with pytest.raises(HelperRefused, match=r"^helper: gpu.reset failed: nvidia-smi --gpu-reset"):
        await client.call("gpu.reset", uuid="GPU-00000000-1")


async def test_a_peer_of_another_uid_is_refused(tmp_path: Path) -> None:
    server = await HelperServer(Layout(tmp_path / "root"), os.getuid() + 1).start(tmp_path / "h.sock")
    async with server:
        with pytest.raises(HelperRefused, match=rf"^helper: refused: uid {os.getuid()} may not use this helper"):
            await HelperClient(tmp_path / "h.sock").call("helper.hello")
    assert not (tmp_path / "root").exists()


async def test_a_helper_that_is_down_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(HelperUnavailable, match=r"^helper: cannot reach"):
        await HelperClient(tmp_path / "none.sock").call("helper.hello")


async def test_doctors_helper_check_passes_on_an_answering_helper_and_fails_on_none(
    served: tuple[HelperClient, FakeRunner, Path], tmp_path: Path
) -> None:
    found = await asyncio.to_thread(checks.check_helper, tmp_path / "h.sock")
    assert (found.status, found.message) == (
        "pass",
        f"bc helper answers at {tmp_path / 'h.sock'} (protocol 1, root {tmp_path / 'root'})",
    )
    missing = await asyncio.to_thread(checks.check_helper, tmp_path / "none.sock")
    assert missing.status == "fail" and "does not answer" in missing.message and "bc-helper.service" in missing.fix
    # bc doctor on the node: then the release roots the helper names in its answer (none under this root yet)
    (tmp_path / "node").mkdir()
    found_all = await asyncio.to_thread(doctor.helper_checks, tmp_path / "node", tmp_path / "h.sock")
    assert [(f.name, f.status) for f in found_all][1:] == [("helper", "pass"), ("release-roots", "warn")]
    assert str(tmp_path / "root/etc/bc/release-roots.pem") in found_all[2].message


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the data dir to another user")
def test_doctors_privileges_check_says_whether_the_agent_is_root(tmp_path: Path) -> None:
    (tmp_path / "node").mkdir()
    assert checks.check_not_root(tmp_path / "node").status == "fail"
    os.chown(tmp_path / "node", 65534, 65534)
    assert checks.check_not_root(tmp_path / "node").status == "pass"
    assert checks.applies(tmp_path / "node", None)


def test_doctors_release_roots_check_judges_the_file_as_the_helper_does(tmp_path: Path) -> None:
    """`bc doctor` on a helper node: the release roots file the helper names in its hello, by the helper's rule."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    me = os.geteuid()
    path = tmp_path / "etc/bc/release-roots.pem"
    missing = checks.check_release_roots(path, owner=me)
    assert missing.status == "warn" and missing.message.endswith("so bc helper refuses every self-update")
    assert "openssl pkey" in missing.fix and str(path) in missing.fix
    path.parent.mkdir(parents=True)
    key = ed25519.Ed25519PrivateKey.generate().public_key()
    path.write_bytes(
        b"# the lab's release root\n"
        + key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    path.chmod(0o644)
    good = checks.check_release_roots(path, owner=me)
    assert (good.status, good.message) == ("pass", f"{path} lists 1 release root bc helper trusts")
    path.chmod(0o666)
    assert "no one else may write" in checks.check_release_roots(path, owner=me).message
    path.chmod(0o644)
    assert checks.check_release_roots(path, owner=me + 1).status == "fail"  # not the helper's user's
    path.write_bytes(b"no keys here\n")
    bad = checks.check_release_roots(path, owner=me)
    assert bad.status == "fail" and "no Ed25519 PUBLIC KEY" in bad.message
    path.unlink()
    path.symlink_to(tmp_path / "elsewhere.pem")
    assert checks.check_release_roots(path, owner=me).status == "fail"  # the helper opens it O_NOFOLLOW
