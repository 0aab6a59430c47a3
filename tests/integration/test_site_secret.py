"""The site's BMC credentials from the secret broker (`site.credentials_secret_ref`, docs/metal.md).

A real `bc serve` (the `lab` fixture: SQLite and PostgreSQL), a site agent joined with a `--role site` token,
and a real Redfish BMC (sushy-tools' emulator behind its HTTP edge, which checks Basic credentials itself:
tests/redfish_bmc.py). The credentials are set with `SetSecret` (`bc secret set`), delivered as a JWE to the
site, and never stored, logged or written in the clear; a rotation is what the next `bmc.*` command drives
the BMC with; a scope that does not admit the site fails the section, and an unavailable broker keeps it
PROGRESSING, as for the other consumers (tests/integration/test_secrets.py).
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bc.gateway.secret_feed import NoBroker
from bc.protocol.pb import admin_pb2, common_pb2
from tests.integration.conftest import InprocLab
from tests.integration.test_secrets import store_dump
from tests.integration.test_site_lab import settled, start_site
from tests.redfish_bmc import SYSTEM_MAC, RedfishBmcUnderTest, redfish_bmc

NAME = "bmc-creds"


@pytest.fixture(scope="module")
def bmc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedfishBmcUnderTest]:
    with redfish_bmc(tmp_path_factory.mktemp("bmc")) as b:
        yield b


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)


def password() -> str:
    return "pw-" + secrets.token_hex(12)


def creds(pw: str) -> bytes:
    return json.dumps({"default": {"username": "admin", "password": pw}}).encode()


async def set_section(lab: InprocLab, bmc: RedfishBmcUnderTest) -> int:
    section = {"machines": [{"name": "m1", "bmcUrl": bmc.url, "macs": [SYSTEM_MAC]}], "credentialsSecretRef": NAME}
    return int((await lab.admin.set_spec_section("s1", "site", json.dumps(section))).generation)


async def site_section(lab: InprocLab, state: str, after_seq: int = 0) -> common_pb2.SectionStatus:
    """The site section once a status report says it is in `state` (a node.status event)."""
    await lab.wait_event(
        "node.status",
        lambda ev, d: ev.subject == "s1" and ev.seq > after_seq and d["sections"].get("site") == state,
        timeout=30,
    )
    node = await lab.admin.get_node("s1")
    return next(s for s in node.sections if s.section == "site")


async def run(lab: InprocLab, kind: str, payload: dict[str, Any]) -> admin_pb2.CommandInfo:
    cmd = await lab.admin.run_command("s1", kind, payload_json=json.dumps(payload))
    return await settled(lab, cmd.id)


async def test_bmc_kinds_drive_the_bmc_with_the_brokers_secret_and_a_rotation_is_used_next(
    lab: InprocLab, bmc: RedfishBmcUnderTest, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    caplog.set_level(logging.DEBUG)
    first, second = password(), password()
    bmc.state.accounts["admin"] = first
    await start_site(lab, "s1")
    await lab.wait_observed("s1", 1)
    await lab.admin.set_secret(NAME, creds(first), nodes=["s1"])
    generation = await set_section(lab, bmc)
    await lab.wait_observed("s1", generation, timeout=30)
    node = await lab.admin.get_node("s1")
    [status] = [s for s in node.sections if s.section == "site"]
    assert status.state == common_pb2.CONVERGED, status
    delivered = await lab.wait_event("secret.delivered", lambda ev, d: ev.subject == "s1")
    d = json.loads(delivered.data_json)
    assert (d["name"], d["version"], d["section"], d["generation"]) == (NAME, 1, "site", generation)
    listed = await lab.admin.list_secrets()
    assert [(s.name, list(s.used_by)) for s in listed.secrets] == [(NAME, ["s1/site"])]

    done = await run(lab, "bmc.query", {"machine": "m1"})
    assert done.state == "succeeded", done
    assert SYSTEM_MAC in json.loads(done.result_json)["inventory"]["nics"]

    # The BMC's password is changed out of band: the held secret no longer opens it ...
    bmc.state.accounts["admin"] = second
    done = await run(lab, "bmc.query", {"machine": "m1"})
    assert (done.state, done.reason) == ("failed", "bmc-auth-failed"), done
    # ... until the secret is set again: delivered (v2), and the next command drives the BMC with it.
    await lab.admin.set_secret(NAME, creds(second))
    await lab.wait_event("secret.delivered", lambda ev, d: ev.subject == "s1" and d["version"] == 2)
    done = await run(lab, "bmc.query", {"machine": "m1"})
    assert done.state == "succeeded", done
    agent = lab.agents["s1"]
    assert agent.secrets is not None and agent.secrets.version(NAME, "site") == 2

    # bmc.rotate cannot write back through the broker (not built): refused before the BMC is touched.
    done = await run(lab, "bmc.rotate", {"machine": "m1"})
    assert (done.state, done.reason) == ("failed", "bmc-credentials"), done
    assert "not built" in done.message and bmc.state.accounts["admin"] == second

    # Neither password is in the store (spec rows included), a log record, the site's files, or a result.
    dump = await store_dump(lab)
    for pw in (first, second):
        assert pw.encode() not in dump
        assert not [r for r in caplog.records if pw in r.getMessage()]
        for path in lab.node_dir("s1").rglob("*"):
            if path.is_file():
                assert pw.encode() not in path.read_bytes(), path
    assert NAME in (await lab.admin.get_spec("s1")).spec_json


async def test_a_scope_that_does_not_admit_the_site_fails_the_section_until_it_does(
    lab: InprocLab, bmc: RedfishBmcUnderTest
) -> None:
    pw = password()
    bmc.state.accounts["admin"] = pw
    await start_site(lab, "s1")
    await lab.wait_observed("s1", 1)
    await lab.admin.set_secret(NAME, creds(pw), labels=["pool=bmc"])
    await set_section(lab, bmc)
    ev = await lab.wait_event("secret.refused", lambda ev, d: ev.subject == "s1" and d["reason"] == "out-of-scope")
    assert json.loads(ev.data_json)["section"] == "site"
    failed = await site_section(lab, "FAILED")
    assert failed.reason == "SecretRefused" and "out-of-scope" in failed.message
    asked = len(bmc.state.requests)
    done = await run(lab, "bmc.query", {"machine": "m1"})
    assert (done.state, done.reason) == ("failed", "bmc-credentials"), done
    assert "refused" in done.message and len(bmc.state.requests) == asked  # no BMC was contacted

    await lab.admin.label_node("s1", {"pool": "bmc"}, [])
    seq = (await lab.admin.fleet_snapshot()).event_seq
    await lab.admin.set_secret(NAME, creds(pw))  # the same scope: the site is told to ask again
    await site_section(lab, "CONVERGED", after_seq=seq)
    done = await run(lab, "bmc.query", {"machine": "m1"})
    assert done.state == "succeeded", done


async def test_an_unavailable_broker_keeps_the_section_progressing(lab: InprocLab, bmc: RedfishBmcUnderTest) -> None:
    pw = password()
    bmc.state.accounts["admin"] = pw
    await start_site(lab, "s1")
    await lab.wait_observed("s1", 1)
    broker = lab.server.gateway.secrets
    lab.server.gateway.secrets = NoBroker()
    await lab.admin.set_secret(NAME, creds(pw), nodes=["s1"])
    generation = await set_section(lab, bmc)
    waiting = await site_section(lab, "PROGRESSING")
    assert waiting.reason == "SecretUnavailable"
    assert (await lab.admin.get_node("s1")).observed_generation < generation  # not settled
    done = await run(lab, "bmc.query", {"machine": "m1"})
    assert (done.state, done.reason) == ("failed", "bmc-credentials"), done

    lab.server.gateway.secrets = broker
    await lab.admin.set_secret(NAME, creds(pw))  # a rotation wakes the site at once
    await lab.wait_observed("s1", generation, timeout=30)
    done = await run(lab, "bmc.query", {"machine": "m1"})
    assert done.state == "succeeded", done
