"""The site section, the image cache and the boot server's HTTP half, over real HTTP on 127.0.0.1.

* the section stays PROGRESSING while images warm, is CONVERGED once each is cached, and is FAILED for an
  image whose bytes do not match its digest (naming its URL); a download that fails is retried;
* `boot.prepareRamdisk` sets a lease: the machine's iPXE script and the images it names are served, to
  that machine's MAC only, while the lease lives; `boot.cleanUp` (or the lease's end) takes them away;
* a cached image whose bytes changed on disk is not served (re-checked at every request);
* `site.httpProxy` reaches a listed target and never a BMC.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from google.protobuf import any_pb2
from google.protobuf.message import Message

from agent.converge.run import CONVERGED, FAILED, PROGRESSING
from agent.hw.fake import FakeHardware
from agent.kinds.base import InvalidPayload, KindContext, KindResult
from agent.offload import to_thread
from agent.site.converger import SiteConverger
from agent.site.role import site_executors
from agent.site.state import SiteOptions, SiteState
from bc.protocol.pb import site_kinds_pb2 as pb
from bc.protocol.pb import spec_pb2

KERNEL = b"kernel bytes " * 1000
OS_IMAGE = b"an installed OS " * 4000
INITRD = b"initramfs bytes " * 3000
MAC = "52:54:00:aa:bb:01"
OTHER_MAC = "52:54:00:aa:bb:02"


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


class ManualClock:
    """The site's wall clock, moved by the test (leases end by it)."""

    def __init__(self) -> None:
        self.t = 1_800_000_000.0

    def now(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(0)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class Images:
    """An image server: `/kernel`, `/initrd`, `/liar` (bytes that are not its digest's); `gate` holds answers."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.files = {"/kernel": KERNEL, "/initrd": INITRD, "/os": OS_IMAGE, "/liar": b"not what you asked for"}


@pytest.fixture
def images() -> Iterator[tuple[str, Images]]:
    state = Images()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            state.gate.wait(30)
            body = state.files.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        state.gate.set()
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)


class Site:
    def __init__(self, tmp_path: Path) -> None:
        self.changed = asyncio.Event()
        self.clock = ManualClock()
        self.state = SiteState(
            tmp_path / "data", self.clock, to_thread, SiteOptions(run_dnsmasq=False), wake=self.changed.set
        )
        self.converger = SiteConverger(self.state)
        self.executors = site_executors(self.state)
        hw = FakeHardware("hgx-h100-8", "site-a", state_dir=tmp_path / "hw")
        self.ctx = KindContext(
            node_id="site-a", data_dir=tmp_path / "data", hw=hw, cdi_dir=tmp_path / "cdi", boot_id="b"
        )
        self.http = f"127.0.0.1:{free_port()}"

    def section(self, base: str, *names: str, digests: dict[str, str] | None = None) -> spec_pb2.SiteSection:
        digests = digests or {}
        want = {
            "kernel": sha(KERNEL),
            "initrd": sha(INITRD),
            "os": sha(OS_IMAGE),
            "liar": sha(b"the bytes the operator meant"),
        }
        return spec_pb2.SiteSection(
            cache_images=[spec_pb2.CacheImage(url=f"{base}/{n}", sha256=digests.get(n, want[n])) for n in names],
            machines=[spec_pb2.SiteMachine(name="m1", bmc_url="https://10.9.0.1", macs=[MAC])],
            boot=spec_pb2.SiteBootServer(interface="lo", dhcp_range="127.0.0.10,127.0.0.20", http_address=self.http),
        )

    async def converge_until_settled(self, section: spec_pb2.SiteSection, generation: int = 1) -> Any:
        while True:
            self.changed.clear()
            result = await self.converger.converge(section, generation)
            if result.reported_state != PROGRESSING or result.reason != "ImagesWarming":
                return result
            async with asyncio.timeout(30):
                await self.changed.wait()

    async def run(self, kind: str, request: Message) -> KindResult:
        payload = any_pb2.Any()
        payload.Pack(request)
        ex = self.executors[kind]
        try:
            parsed = ex.parse(payload)
        except InvalidPayload as e:
            return KindResult.failure("invalid-payload", e.message)
        return await ex.run(self.ctx, parsed)

    async def get(self, path: str) -> httpx.Response:
        async with httpx.AsyncClient(trust_env=False) as c:
            return await c.get(f"http://{self.http}{path}")


@pytest.fixture
async def site(tmp_path: Path) -> Any:
    s = Site(tmp_path)
    yield s
    await s.state.close()


def prepare(**kw: Any) -> pb.BootPrepareRamdiskRequest:
    base: dict[str, Any] = {
        "machine": "m1",
        "kernel_sha256": sha(KERNEL),
        "initrd_sha256": sha(INITRD),
        "cmdline": "console=ttyS0",
        "join_token": "tok.en-123",
        "lease_s": 600,
    }
    return pb.BootPrepareRamdiskRequest(**{**base, **kw})


async def test_the_section_progresses_while_images_warm_then_converges(site: Site, images: tuple[str, Images]) -> None:
    base, server = images
    server.gate.clear()  # the image server holds its answers: the images are warming
    section = site.section(base, "kernel", "initrd")
    first = await site.converger.converge(section, 1)
    assert (first.reported_state, first.reason) == (PROGRESSING, "ImagesWarming")
    assert "0 of 2 images cached" in first.message
    server.gate.set()
    result = await site.converge_until_settled(section)
    assert result.state == CONVERGED, result.message
    cached = site.state.site_dir / "images"
    assert (cached / sha(KERNEL)).read_bytes() == KERNEL
    assert (cached / sha(INITRD)).read_bytes() == INITRD


async def test_an_image_whose_bytes_do_not_match_fails_the_section(site: Site, images: tuple[str, Images]) -> None:
    base, _ = images
    result = await site.converge_until_settled(site.section(base, "kernel", "liar"))
    assert (result.state, result.terminal, result.reason) == (FAILED, True, "ImageDigestMismatch")
    assert f"{base}/liar" in result.message and sha(b"not what you asked for") in result.message
    assert not (site.state.site_dir / "images" / sha(b"the bytes the operator meant")).exists()
    # Next pass, same generation: still FAILED (the rest of the spec may settle); no second download.
    again = await site.converger.converge(site.section(base, "kernel", "liar"), 1)
    assert again.state == FAILED


async def test_a_download_that_fails_is_retried_while_the_section_progresses(
    site: Site, images: tuple[str, Images]
) -> None:
    base, server = images
    del server.files["/initrd"]
    section = site.section(base, "kernel", "initrd")
    result = await site.converger.converge(section, 1)
    while "HTTP 404" not in result.message:
        async with asyncio.timeout(30):
            await site.changed.wait()
        site.changed.clear()
        result = await site.converger.converge(section, 1)
    assert (result.reported_state, result.reason) == (PROGRESSING, "ImagesWarming")
    server.files["/initrd"] = INITRD
    assert (await site.converge_until_settled(section)).state == CONVERGED


async def test_a_lease_serves_the_machine_its_ramdisk_and_nothing_else(site: Site, images: tuple[str, Images]) -> None:
    base, _ = images
    assert (await site.converge_until_settled(site.section(base, "kernel", "initrd", "os"))).state == CONVERGED
    # No lease yet: no script, no image.
    assert (await site.get(f"/boot/{MAC}.ipxe")).status_code == 404
    assert (await site.get(f"/images/{sha(KERNEL)}")).status_code == 404

    assert (await site.get(f"/images/{sha(OS_IMAGE)}")).status_code == 404  # cached, named by no lease
    r = await site.run("boot.prepareRamdisk", prepare())
    assert r.ok, r.message
    assert "tok.en-123" not in json.dumps(r.result)
    assert (await site.get(f"/images/{sha(OS_IMAGE)}")).status_code == 404  # not this lease's either
    r = await site.run("boot.prepareRamdisk", prepare(image_sha256=[sha(OS_IMAGE)]))  # the same lease, replaced
    assert r.ok, r.message
    assert r.result["images"] == [f"http://{site.http}/images/{sha(OS_IMAGE)}"]
    assert (await site.get(f"/images/{sha(OS_IMAGE)}")).content == OS_IMAGE
    chain = await site.get("/boot.ipxe")
    assert chain.text == f"#!ipxe\nchain http://{site.http}/boot/${{net0/mac}}.ipxe\n"
    script = (await site.get(f"/boot/{MAC}.ipxe")).text
    assert f"kernel http://{site.http}/images/{sha(KERNEL)} initrd=initrd console=ttyS0" in script
    assert f"bc.join_token=tok.en-123 bc.site=http://{site.http}" in script
    assert f"initrd --name initrd http://{site.http}/images/{sha(INITRD)}" in script
    assert (await site.get(f"/images/{sha(KERNEL)}")).content == KERNEL
    assert (await site.get(f"/images/{sha(INITRD)}")).content == INITRD
    assert (await site.get(f"/boot/{OTHER_MAC}.ipxe")).status_code == 404

    # A cached image whose bytes changed on disk is never served, and is dropped.
    (site.state.site_dir / "images" / sha(INITRD)).write_bytes(INITRD[:-1] + b"!")
    assert (await site.get(f"/images/{sha(INITRD)}")).status_code == 404
    assert not (site.state.site_dir / "images" / sha(INITRD)).exists()

    r = await site.run("boot.cleanUp", pb.BootCleanUpRequest(machine="m1"))
    assert r.ok and r.result == {"machine": "m1", "removed": True}
    assert (await site.get(f"/boot/{MAC}.ipxe")).status_code == 404
    assert (await site.get(f"/images/{sha(KERNEL)}")).status_code == 404
    again = await site.run("boot.cleanUp", pb.BootCleanUpRequest(machine="m1"))
    assert again.ok and again.result["removed"] is False


async def test_a_lease_ends_at_its_time_and_survives_a_restart(
    tmp_path: Path, site: Site, images: tuple[str, Images]
) -> None:
    base, _ = images
    section = site.section(base, "kernel", "initrd")
    assert (await site.converge_until_settled(section)).state == CONVERGED
    assert (await site.run("boot.prepareRamdisk", prepare(lease_s=60))).ok
    await site.state.close()

    later = Site(tmp_path)  # the same data dir: a restarted site agent
    later.http = site.http
    later.clock.t = site.clock.t + 59
    try:
        assert (await later.converger.converge(section, 1)).state == CONVERGED
        assert (await later.get(f"/boot/{MAC}.ipxe")).status_code == 200
        later.clock.t += 2
        assert (await later.get(f"/boot/{MAC}.ipxe")).status_code == 404
    finally:
        await later.state.close()


async def test_prepare_refuses_what_it_cannot_serve(site: Site, images: tuple[str, Images]) -> None:
    base, _ = images
    assert (await site.converge_until_settled(site.section(base, "kernel"))).state == CONVERGED
    r = await site.run("boot.prepareRamdisk", prepare())
    assert (r.ok, r.reason) == (False, "image-not-cached")
    r = await site.run("boot.prepareRamdisk", prepare(machine="m9"))
    assert (r.ok, r.reason) == (False, "unknown-machine")
    r = await site.run("boot.prepareRamdisk", prepare(cmdline='init=/bin/sh "x'))
    assert (r.ok, r.reason) == (False, "invalid-payload")
    r = await site.run("boot.prepareRamdisk", prepare(kernel_sha256="abc"))
    assert (r.ok, r.reason) == (False, "invalid-payload")


@pytest.fixture
def target_server() -> Iterator[tuple[str, list[str]]]:
    """An agentless machine's HTTP endpoint on 127.0.0.2; it records paths and redirects `/away`."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            if self.path == "/away":
                self.send_response(302)
                self.send_header("Location", "http://127.0.0.1/redfish/v1")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            body = json.dumps({"path": self.path, "host": self.headers["Host"]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.2", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"127.0.0.2:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


async def test_http_proxy_reaches_a_listed_target_and_never_a_bmc(
    site: Site, target_server: tuple[str, list[str]]
) -> None:
    address, seen = target_server
    site.state.section = spec_pb2.SiteSection(
        machines=[spec_pb2.SiteMachine(name="m1", bmc_url="http://127.0.0.1:1")],
        proxy_targets=[spec_pb2.SiteProxyTarget(node_id="gpu-07", addresses=["127.0.0.2"])],
    )
    await asyncio.to_thread(site.state.bmc_hosts.remember, "127.0.0.3")  # a BMC driven once, since unlisted

    def req(url: str, node: str = "gpu-07") -> pb.SiteHttpProxyRequest:
        return pb.SiteHttpProxyRequest(target_node_id=node, url=url)

    r = await site.run("site.httpProxy", req(f"http://{address}/metrics"))
    assert r.ok, r.message
    assert r.result["status"] == 200
    assert json.loads(r.result["body"]) == {"path": "/metrics", "host": address}

    forbidden = [
        req("http://127.0.0.1:1/"),  # the listed machine's BMC
        req("http://127.0.0.3/"),  # a BMC this site drove before
        req(f"http://{address}/redfish/v1/Systems"),
        req(f"http://{address}/metrics", node="gpu-99"),
        req("http://127.0.0.4/"),
    ]
    for f in forbidden:
        r = await site.run("site.httpProxy", f)
        assert (r.ok, r.reason) == (False, "forbidden-target"), f.url
    assert seen == ["/metrics"]

    r = await site.run("site.httpProxy", req(f"http://{address}/away"))
    assert r.ok and r.result["status"] == 302  # reported, never followed
    assert seen == ["/metrics", "/away"]
