"""The `bmc.*` kinds against a real Redfish BMC: sushy-tools' emulator (fake driver), started by the tests.

What the emulator lacks in that mode (firmware update, storage, accounts) is faked at the HTTP edge in
front of it (tests/redfish_bmc.py). Also: a BMC that never answers (bmc-timeout, within the site's bounds),
a port nobody listens on (bmc-unreachable), a BMC that answers errors (bmc-error), wrong credentials
(bmc-auth-failed) and a credentials file anyone may read (refused before any request).
"""

from __future__ import annotations

import json
import os
import socket
import stat
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import any_pb2
from google.protobuf.message import Message

from agent.hw.fake import FakeHardware
from agent.kinds.base import InvalidPayload, KindContext, KindResult
from agent.offload import to_thread
from agent.site.redfish import Timeouts
from agent.site.role import site_executors
from agent.site.state import SiteOptions, SiteState
from bc.protocol import kinds
from bc.protocol.pb import site_kinds_pb2 as pb
from bc.protocol.pb import spec_pb2
from bc.seams.clock import SystemClock
from tests.http_server import serving
from tests.redfish_bmc import SYSTEM_MAC, SYSTEM_UUID, RedfishBmcUnderTest, black_hole, redfish_bmc


@pytest.fixture(scope="module")
def bmc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedfishBmcUnderTest]:
    with redfish_bmc(tmp_path_factory.mktemp("bmc")) as b:
        yield b


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)


def creds_file(tmp_path: Path, password: str = "old-password", mode: int = 0o600) -> Path:
    p = tmp_path / "bmc-credentials.json"
    p.write_text(json.dumps({"default": {"username": "admin", "password": password}}))
    p.chmod(mode)
    return p


class Site:
    def __init__(self, tmp_path: Path, machines: list[spec_pb2.SiteMachine], creds: Path, timeouts: Timeouts) -> None:
        self.state = SiteState(tmp_path / "data", SystemClock(), to_thread, SiteOptions(timeouts=timeouts))
        self.state.section = spec_pb2.SiteSection(machines=machines, credentials_file=str(creds))
        self.executors = site_executors(self.state)
        hw = FakeHardware("hgx-h100-8", "site-a", state_dir=tmp_path / "hw")
        self.ctx = KindContext(
            node_id="site-a", data_dir=tmp_path / "data", hw=hw, cdi_dir=tmp_path / "cdi", boot_id="b"
        )

    async def run(self, kind: str, request: Message) -> KindResult:
        payload = any_pb2.Any()
        payload.Pack(request)
        ex = self.executors[kind]
        try:
            parsed = ex.parse(payload)
        except InvalidPayload as e:  # as the dispatcher answers it, before any lock or side effect
            return KindResult.failure("invalid-payload", e.message)
        return await ex.run(self.ctx, parsed)


def machine(name: str, url: str, system_id: str = "") -> spec_pb2.SiteMachine:
    return spec_pb2.SiteMachine(name=name, bmc_url=url, system_id=system_id, macs=[SYSTEM_MAC])


@pytest.fixture
def site(tmp_path: Path, bmc: RedfishBmcUnderTest) -> Site:
    bmc.state.accounts["admin"] = "old-password"
    return Site(tmp_path, [machine("m1", bmc.url)], creds_file(tmp_path), Timeouts(connect_s=2, read_s=10, call_s=30))


def test_every_site_kind_is_registered_for_the_site_role_only(site: Site) -> None:
    assert set(site.executors) == {k.name for k in kinds.KINDS.values() if k.roles == {"site"}}
    assert {"bmc.power", "bmc.boot", "bmc.firmware", "bmc.storage", "bmc.rotate", "site.httpProxy"} <= kinds.DESTRUCTIVE
    assert "bmc.query" not in kinds.DESTRUCTIVE and kinds.is_attested("bmc.rotate")


async def test_query_reports_power_health_inventory_and_boot(site: Site, bmc: RedfishBmcUnderTest) -> None:
    r = await site.run("bmc.query", pb.BmcQueryRequest(machine="m1"))
    assert r.ok, r.message
    assert r.result["machine"] == "m1"
    assert r.result["system_id"] == SYSTEM_UUID
    assert r.result["power_state"] in ("On", "Off")
    assert r.result["health"]["health"] == "OK"
    assert SYSTEM_MAC in r.result["inventory"]["nics"]
    assert r.result["boot"]["target"]
    # The host is remembered before the first request: site.httpProxy refuses it from now on.
    assert json.loads((site.state.site_dir.parent / "bmc-hosts.json").read_text()) == {"hosts": ["127.0.0.1"]}


async def test_power_sends_the_reset_the_action_names(site: Site, bmc: RedfishBmcUnderTest) -> None:
    for action, reset in (("on", "On"), ("off", "ForceOff"), ("reset", "ForceRestart")):
        r = await site.run("bmc.power", pb.BmcPowerRequest(machine="m1", action=action))
        assert r.ok, r.message
        assert r.result["reset_type"] == reset
    assert ("POST", f"/redfish/v1/Systems/{SYSTEM_UUID}/Actions/ComputerSystem.Reset") in bmc.state.requests
    r = await site.run("bmc.power", pb.BmcPowerRequest(machine="m1", action="explode"))
    assert (r.ok, r.reason) == (False, "invalid-payload")


async def test_boot_sets_the_next_device_and_virtual_media(site: Site, bmc: RedfishBmcUnderTest) -> None:
    r = await site.run("bmc.boot", pb.BmcBootRequest(machine="m1", device="pxe"))
    assert r.ok, r.message
    q = await site.run("bmc.query", pb.BmcQueryRequest(machine="m1"))
    assert q.result["boot"]["target"] == "Pxe"

    class Iso(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"\0" * 2048
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_HEAD(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "2048")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    with serving(Iso) as url:
        r = await site.run("bmc.boot", pb.BmcBootRequest(machine="m1", virtual_media_url=f"{url}/ramdisk.iso"))
        assert r.ok, r.message
        assert r.result["inserted"] == f"{url}/ramdisk.iso"
        r = await site.run("bmc.boot", pb.BmcBootRequest(machine="m1", eject_media=True, device="disk"))
        assert r.ok, r.message
        assert r.result["ejected"] is True and r.result["boot"]["target"] == "Hdd"


async def test_a_bmc_that_answers_an_error_fails_the_command_with_its_words(site: Site) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    # The emulator fetches the image itself and answers 500 when it cannot.
    r = await site.run(
        "bmc.boot", pb.BmcBootRequest(machine="m1", virtual_media_url=f"http://127.0.0.1:{closed}/none.iso")
    )
    assert (r.ok, r.reason) == (False, "bmc-error")
    assert "500" in r.message and "Failed fetching image" in r.message


async def test_a_system_the_bmc_does_not_have_is_a_bmc_error(tmp_path: Path, bmc: RedfishBmcUnderTest) -> None:
    site = Site(tmp_path, [machine("m2", bmc.url, "no-such-system")], creds_file(tmp_path), Timeouts())
    r = await site.run("bmc.query", pb.BmcQueryRequest(machine="m2"))
    assert (r.ok, r.reason) == (False, "bmc-error")
    assert "404" in r.message


async def test_firmware_asks_the_bmc_to_pull_the_image(site: Site, bmc: RedfishBmcUnderTest) -> None:
    r = await site.run("bmc.firmware", pb.BmcFirmwareRequest(machine="m1", image_url="https://fw.example/bios.bin"))
    assert r.ok, r.message
    assert bmc.state.updates[-1] == {
        "ImageURI": "https://fw.example/bios.bin",
        "TransferProtocol": "HTTP",
        "Targets": [f"/redfish/v1/Systems/{SYSTEM_UUID}"],
    }
    r = await site.run("bmc.firmware", pb.BmcFirmwareRequest(machine="m1", image_url="ftp://fw.example/x"))
    assert (r.ok, r.reason) == (False, "invalid-payload")


async def test_storage_lists_creates_and_deletes_volumes(site: Site, bmc: RedfishBmcUnderTest) -> None:
    r = await site.run("bmc.storage", pb.BmcStorageRequest(machine="m1", action="list"))
    assert r.ok, r.message
    [controller] = r.result["storage"]
    assert [d["id"] for d in controller["drives"]] == ["d0", "d1"]
    r = await site.run(
        "bmc.storage",
        pb.BmcStorageRequest(
            machine="m1", action="create-volume", storage_id="1", volume_name="boot", capacity_bytes=10**11
        ),
    )
    assert r.ok, r.message
    listed = await site.run("bmc.storage", pb.BmcStorageRequest(machine="m1", action="list"))
    [vol] = listed.result["storage"][0]["volumes"]
    assert (vol["name"], vol["capacity_bytes"]) == ("boot", 10**11)
    r = await site.run(
        "bmc.storage", pb.BmcStorageRequest(machine="m1", action="delete-volume", storage_id="1", volume_id=vol["id"])
    )
    assert r.ok, r.message
    listed = await site.run("bmc.storage", pb.BmcStorageRequest(machine="m1", action="list"))
    assert listed.result["storage"][0]["volumes"] == []


async def test_rotate_replaces_the_password_on_the_bmc_and_in_the_0600_file(
    site: Site, bmc: RedfishBmcUnderTest
) -> None:
    creds = Path(site.state.section.credentials_file)
    r = await site.run("bmc.rotate", pb.BmcRotateRequest(machine="m1"))
    assert r.ok, r.message
    stored = json.loads(creds.read_text())["machines"]["m1"]
    assert stored["username"] == "admin" and stored["password"] != "old-password"
    assert bmc.state.accounts["admin"] == stored["password"]
    assert stat.S_IMODE(creds.stat().st_mode) == 0o600
    assert stored["password"] not in json.dumps(r.result) + r.message
    # The new password is the one that works now, and the old one is refused.
    assert (await site.run("bmc.query", pb.BmcQueryRequest(machine="m1"))).ok
    creds.write_text(json.dumps({"default": {"username": "admin", "password": "old-password"}}))
    r = await site.run("bmc.query", pb.BmcQueryRequest(machine="m1"))
    assert (r.ok, r.reason) == (False, "bmc-auth-failed")


async def test_a_rotation_the_bmc_refuses_keeps_the_password_in_use(site: Site, bmc: RedfishBmcUnderTest) -> None:
    creds = Path(site.state.section.credentials_file)
    r = await site.run("bmc.rotate", pb.BmcRotateRequest(machine="m1", username="nobody"))
    assert (r.ok, r.reason) == (False, "bmc-error")
    assert "no account 'nobody'" in r.message
    stored = json.loads(creds.read_text())
    assert stored["machines"]["m1"] == {"username": "admin", "password": "old-password"}  # no pending left
    assert bmc.state.accounts == {"admin": "old-password"}


async def test_a_rotation_whose_file_cannot_be_staged_never_touches_the_bmc(
    site: Site, bmc: RedfishBmcUnderTest
) -> None:
    creds = Path(site.state.section.credentials_file)
    creds.parent.joinpath(f".{creds.name}.new").mkdir()  # the staging write cannot create its file
    before = len(bmc.state.requests)
    r = await site.run("bmc.rotate", pb.BmcRotateRequest(machine="m1"))
    assert (r.ok, r.reason) == (False, "bmc-credentials")
    assert "the BMC was not touched" in r.message
    assert not [q for q in bmc.state.requests[before:] if q[0] == "PATCH"]
    assert bmc.state.accounts == {"admin": "old-password"}


async def test_a_credentials_file_others_may_read_is_refused_before_any_request(
    tmp_path: Path, bmc: RedfishBmcUnderTest
) -> None:
    site = Site(tmp_path, [machine("m1", bmc.url)], creds_file(tmp_path, mode=0o644), Timeouts())
    before = len(bmc.state.requests)
    r = await site.run("bmc.power", pb.BmcPowerRequest(machine="m1", action="on"))
    assert (r.ok, r.reason) == (False, "bmc-credentials")
    assert "0644" in r.message and "chmod 600" in r.message
    assert len(bmc.state.requests) == before


async def test_an_unknown_machine_is_refused(site: Site) -> None:
    r = await site.run("bmc.power", pb.BmcPowerRequest(machine="m9", action="off"))
    assert (r.ok, r.reason) == (False, "unknown-machine")


async def test_a_bmc_that_never_answers_times_out_within_the_bounds(tmp_path: Path) -> None:
    with black_hole() as url:
        site = Site(tmp_path, [machine("m1", url)], creds_file(tmp_path), Timeouts(connect_s=1, read_s=0.5, call_s=5))
        started = time.monotonic()
        r = await site.run("bmc.query", pb.BmcQueryRequest(machine="m1"))
    assert (r.ok, r.reason) == (False, "bmc-timeout")
    assert time.monotonic() - started < 5


async def test_a_bmc_nobody_listens_for_is_unreachable(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    site = Site(tmp_path, [machine("m1", f"http://127.0.0.1:{port}")], creds_file(tmp_path), Timeouts())
    r = await site.run("bmc.query", pb.BmcQueryRequest(machine="m1"))
    assert (r.ok, r.reason) == (False, "bmc-unreachable")
    assert os.path.exists(site.state.site_dir.parent / "bmc-hosts.json")
