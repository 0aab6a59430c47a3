"""The site converger with `credentials_secret_ref` against a scripted secret port (the broker's own side is
tests/integration/test_site_secret.py): what each answer makes of the section and of a BMC's credentials."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.converge.run import CONVERGED, FAILED, PROGRESSING, UNSUPPORTED
from agent.converge.secret_port import SecretRefused, SecretUnavailable
from agent.offload import to_thread
from agent.site.converger import SiteConverger
from agent.site.credentials import CredentialsError
from agent.site.state import SiteOptions, SiteState
from bc.protocol.pb import spec_pb2
from bc.seams.clock import SystemClock

SECTION = spec_pb2.SiteSection(
    machines=[spec_pb2.SiteMachine(name="m1", bmc_url="http://127.0.0.1:1")], credentials_secret_ref="bmc-creds"
)


class Port:
    """Answers what `answer` holds; records what it was asked."""

    def __init__(self, answer: bytes | Exception) -> None:
        self.answer = answer
        self.asked: list[tuple[str, str, int]] = []
        self.released: list[str] = []

    async def get(self, name: str, section: str, generation: int, unit: str = "", allocation_id: str = "") -> bytes:
        self.asked.append((name, section, generation))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer

    def release(self, section: str, unit: str = "") -> None:
        self.released.append(section)


def site(tmp_path: Path, port: Port | None) -> SiteState:
    return SiteState(tmp_path, SystemClock(), to_thread, SiteOptions(run_dnsmasq=False), secret_source=port)


@pytest.mark.parametrize(
    ("answer", "state", "reason"),
    [
        (b'{"default": {"username": "admin", "password": "hunter2"}}', CONVERGED, ""),
        (SecretUnavailable("no session to ask the broker on"), PROGRESSING, "SecretUnavailable"),
        (SecretRefused("out-of-scope", "not admitted"), FAILED, "SecretRefused"),
        (b"hunter2 is not json", FAILED, "BadCredentials"),
        (b'{"default": "hunter2"}', CONVERGED, ""),  # the shape of an entry is checked when a machine needs it
    ],
)
async def test_the_section_reports_what_the_broker_answered(
    tmp_path: Path, answer: bytes | Exception, state: int, reason: str
) -> None:
    port = Port(answer)
    result = await SiteConverger(site(tmp_path, port)).converge(SECTION, 7)
    assert (result.state, result.reason) == (state, reason), result
    assert port.asked == [("bmc-creds", "site", 7)]
    assert "hunter2" not in result.message


async def test_a_bmc_takes_the_secrets_credential_asked_again_each_time(tmp_path: Path) -> None:
    doc = {"default": {"username": "a", "password": "one"}, "machines": {"m1": {"username": "root", "password": "two"}}}
    port = Port(json.dumps(doc).encode())
    st = site(tmp_path, port)
    await SiteConverger(st).converge(SECTION, 3)
    seen: list[tuple[str, str]] = []

    def open_bmc(url: str, system_id: str, cred: object) -> object:
        seen.append((cred.username, cred.password))  # type: ignore[attr-defined]
        raise OSError("no BMC here")

    st.open_bmc = open_bmc  # type: ignore[assignment]
    with pytest.raises(Exception):  # noqa: B017 - the BMC's failure, after the credential was read
        await st.bmc(st.machine("m1"))
    assert seen == [("root", "two")] and port.asked[-1] == ("bmc-creds", "site", 3) and len(port.asked) == 2
    port.answer = SecretRefused("not-bound", "no")
    with pytest.raises(CredentialsError, match="refused by the broker"):
        await st.bmc(st.machine("m1"))
    port.answer = b'{"default": {"username": "admin", "password": 3}}'
    with pytest.raises(CredentialsError, match="must be an object with string username and password") as e:
        await st.bmc(st.machine("m1"))
    assert "3" not in str(e.value).replace("m1", "")


async def test_without_a_broker_the_ref_is_unsupported_and_without_a_ref_the_held_secret_is_released(
    tmp_path: Path,
) -> None:
    result = await SiteConverger(site(tmp_path / "a", None)).converge(SECTION, 1)
    assert (result.state, result.reason, result.terminal) == (UNSUPPORTED, "FieldUnsupported", True)
    port = Port(b"{}")
    result = await SiteConverger(site(tmp_path / "b", port)).converge(spec_pb2.SiteSection(), 2)
    assert result.state == CONVERGED and port.released == ["site"] and port.asked == []
