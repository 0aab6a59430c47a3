"""An unprivileged node's TPM through `bc helper`: swtpm on a unix socket in a directory only root may enter (as
/dev/tpmrm0 is root's and group tss's), `bc helper --tcti` as root, and the node's side as a user of its own.

The user (1) cannot reach the TPM itself, (2) makes its node key, signs, has a next key certified by the AK, reads
the EK certificate and activates a credential through the helper's `tpm.*` operations, all of which the test
judges as the server would, (3) has a handle, a TCTI, a foreign slot and a digest of another size refused; and
`bc join --attestor tpm --helper-socket`, `bc doctor` and `bc node` as that user join a real bc serve that checks
the AK against the EK certificate, find the TPM through the helper, and get a session certificate by a signature
the TPM made through it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from bc.pki import attest, keys
from bc.pki.tpm_attest import TpmCertification, ak_uri, ak_uri_of, check_tpm_key, parse_public
from bc.pki.tpm_ek import EK_ROOTS_FILE, ek_public_key
from tests.e2e.harness import bc_executable
from tests.helper_process import helper_listening
from tests.integration.conftest import open_lab
from tests.swtpm import EkCa, Swtpm, manufacture, start
from tests.system_user import User, as_user, system_user, traversable_dir, why_not

REPO = Path(__file__).resolve().parents[2]


def _why_not() -> str | None:
    if not (shutil.which("swtpm_setup") and shutil.which("tpm2_createek")):
        return "needs swtpm, swtpm-tools and tpm2-tools (Debian: swtpm swtpm-tools tpm2-tools; .ci/run installs them)"
    return why_not()


pytestmark = pytest.mark.skipif(_why_not() is not None, reason=_why_not() or "")


@pytest.fixture
def user() -> Iterator[User]:
    with system_user("bct") as u:
        yield u


@pytest.fixture
def box() -> Iterator[Path]:
    with traversable_dir("bc-tpm-helper-") as d:
        yield d


@dataclass
class TpmHelper:
    socket: Path
    tpm: Swtpm
    ca: EkCa


@pytest.fixture
async def helper(user: User, box: Path) -> AsyncIterator[TpmHelper]:
    """swtpm in a 0700 root directory (the user cannot connect to it) and bc helper as root in front of it."""
    private = box / "tpm"
    private.mkdir(mode=0o700)
    ca = await manufacture(private / "state", private / "ca")
    tpm = await start(private / "state", unix_dir=private)
    root = box / "root"
    root.mkdir(mode=0o755)
    sock = box / "run" / "helper.sock"
    try:
        async with helper_listening(
            "--socket", str(sock), "--allow-uid", str(user.uid), "--root", str(root),
            "--fake-commands", str(box / "commands.jsonl"), "--tcti", tpm.tcti,
        ):  # fmt: skip
            yield TpmHelper(sock, tpm, ca)
    finally:
        await tpm.stop()


def _env(home: Path) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "PYTHONPATH": str(REPO),
        "PYTHONDONTWRITEBYTECODE": "1",
    }


async def run_as(user: User, home: Path, *argv: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *as_user(user.uid, gid=user.gid), *argv, cwd=str(home), env=_env(home),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(180):
        out, err = await proc.communicate()
    return proc.returncode or 0, out.decode(), err.decode()


NODE = r"""
import asyncio, base64, json, os, socket, subprocess, sys
from pathlib import Path
from agent.helper.client import HelperClient, HelperError
from agent.helper.node_tpm import open_tpm
from agent.tpm import HANDLES, TpmNodeKey
from bc.pki import tpm_credential
from bc.pki.tpm_attest import spki
from bc.pki.tpm_ek import ak_name
from cryptography import x509

sock, tcti = Path(sys.argv[1]), sys.argv[2]
out = {}

async def main():
    # (1) the TPM itself is out of this user's reach
    direct = subprocess.run(["tpm2_getrandom", "4"], env={**os.environ, "TPM2TOOLS_TCTI": tcti},
                            capture_output=True, text=True)
    out["direct"] = [direct.returncode, direct.stderr[-300:]]
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(tcti.removeprefix("swtpm:path="))
        out["connect"] = "connected"
    except PermissionError as e:
        out["connect"] = f"PermissionError: {e.strerror}"
    # (2) the node key's whole life, through the helper
    tpm = open_tpm(sock, None)
    key = await TpmNodeKey.create(tpm, HANDLES[0])
    out["record"] = key.record.dump().decode()
    out["signature"] = base64.b64encode(await key.sign(b"a message")).decode()
    nxt = await key.create_next()
    out["next"] = {k: base64.b64encode(v).decode() for k, v in
                   (("public", nxt.tpm2b_public), ("attest", nxt.attest), ("signature", nxt.signature))}
    out["ak_spki"] = base64.b64encode(spki(await tpm.attestation_key())).decode()
    ek = await tpm.ek_certificate()
    out["ek"] = base64.b64encode(ek).decode()
    ak = await tpm.attestation_public()
    secret = b"s" * 32
    ek_key = x509.load_der_x509_certificate(ek).public_key()
    credential, sealed = tpm_credential.make_credential(ek_key, ak_name(ak.tpm2b, spki(ak.key)), secret, os.urandom(32))
    out["activated"] = (await tpm.activate_credential(credential, sealed)) == secret
    credential, sealed = tpm_credential.make_credential(ek_key, b"\x00\x0b" + bytes(32), secret, os.urandom(32))
    try:
        await tpm.activate_credential(credential, sealed)
        out["foreign"] = "activated"
    except HelperError as e:
        out["foreign"] = str(e)
    out["evicted"] = [await tpm.evict(nxt.handle), await tpm.evict(nxt.handle)]
    out["after_evict"] = await tpm.read_public(nxt.handle)
    # (3) what the table does not take
    client = HelperClient(sock)
    refusals = {
        "handle": ("tpm.key.create", dict(slot=0, handle=0x81000001)),
        "tcti": ("tpm.ak.public", dict(tcti="device:/dev/tpm0")),
        "slot": ("tpm.key.sign", dict(slot=2, digest=base64.b64encode(bytes(32)).decode())),
        "digest": ("tpm.key.sign", dict(slot=0, digest=base64.b64encode(bytes(31)).decode())),
    }
    for name, (op, args) in refusals.items():
        try:
            await client.call(op, **args)
            out[name] = "done"
        except HelperError as e:
            out[name] = str(e)

asyncio.run(main())
print(json.dumps(out))
"""


async def test_an_unprivileged_node_reaches_its_tpm_only_through_the_helper(
    user: User, box: Path, helper: TpmHelper
) -> None:
    home = box / "agent"
    home.mkdir()
    os.chown(home, user.uid, user.gid)
    code, stdout, stderr = await run_as(user, home, sys.executable, "-c", NODE, str(helper.socket), helper.tpm.tcti)
    assert code == 0, stderr
    out = json.loads(stdout.splitlines()[-1])

    # (1) The user could not open the TPM's socket itself.
    assert out["direct"][0] != 0 and "Failed to instantiate TCTI" in out["direct"][1], out["direct"]
    assert out["connect"] == "PermissionError: Permission denied"
    # (2) What the helper's TPM made holds up as the server judges it.
    record = json.loads(out["record"])
    public = serialization.load_der_public_key(bytes.fromhex(record["public"]))
    assert attest.verify(public, b"a message", base64.b64decode(out["signature"]))  # type: ignore[arg-type]
    ak_der = base64.b64decode(out["ak_spki"])
    assert record["ak"] == ak_uri(serialization.load_der_public_key(ak_der))  # type: ignore[arg-type]
    nxt = {k: base64.b64decode(v) for k, v in out["next"].items()}
    certified = TpmCertification(ak_der, nxt["public"], nxt["attest"], nxt["signature"])
    check_tpm_key(certified, parse_public(nxt["public"]).key, record["ak"])
    ek = ek_public_key(base64.b64decode(out["ek"]), [helper.ca.root, helper.ca.issuer], _now())
    assert ek.key_size == 2048
    assert out["activated"] is True
    assert out["foreign"].startswith("helper: tpm.credential.activate failed: the TPM refused tpm2_activatecredential")
    assert out["evicted"] == [True, False] and out["after_evict"] is None
    # (3) Refused before the TPM is touched, each with its reason.
    assert out["handle"] == "helper: refused: tpm.key.create takes no handle"
    assert out["tcti"] == "helper: refused: tpm.ak.public takes no tcti"
    assert out["slot"] == "helper: refused: tpm.key.sign: slot must be an integer from 0 to 1"
    assert out["digest"] == "helper: refused: tpm.key.sign: digest is 31 bytes, not a SHA-256 digest's 32"


def _now() -> __import__("datetime").datetime:  # type: ignore[name-defined]
    import datetime

    return datetime.datetime.now(datetime.UTC)


async def test_bc_join_and_bc_doctor_as_the_nodes_user_activate_and_check_the_tpm_through_the_helper(
    user: User, box: Path, helper: TpmHelper
) -> None:
    server_dir = box / "server"
    (server_dir / "server" / "pki").mkdir(parents=True)
    (server_dir / "server" / "pki" / EK_ROOTS_FILE).write_bytes(helper.ca.pem())
    async with open_lab(server_dir) as lab:
        tok = await lab.admin.create_token("n1")
        data = box / "node"
        data.mkdir(mode=0o700)
        os.chown(data, user.uid, user.gid)
        code, stdout, stderr = await run_as(
            user, data, bc_executable(), "join", "--server", lab.server.address, "--token", tok.token,
            "--data-dir", str(data), "--attestor", "tpm", "--helper-socket", str(helper.socket), "--json",
        )  # fmt: skip
        assert code == 0, stderr
        assert json.loads(stdout)["node_id"] == "n1"
        ev = await lab.wait_event("node.joined", lambda ev, data: ev.subject == "n1")
        assert json.loads(ev.data_json)["endorsement"] == "activated"
        cert = keys.load_cert_pem((data / "node.crt").read_bytes())
        assert ak_uri_of(cert) == json.loads((data / "node.key").read_text())["ak"]
        assert isinstance(cert, x509.Certificate)

        code, stdout, stderr = await run_as(
            user, data, bc_executable(), "doctor", "--data-dir", str(data), "--helper-socket", str(helper.socket),
            "--json",
        )  # fmt: skip
        findings = {f["name"]: f for f in json.loads(stdout)["checks"]}
        assert findings["tpm"]["status"] == "pass", findings["tpm"]
        assert f"bc helper at {helper.socket}" in findings["tpm"]["message"]

        # bc node as that user: its session key is certified by a signature the TPM made through the helper.
        node = await asyncio.create_subprocess_exec(
            *as_user(user.uid, gid=user.gid), bc_executable(), "node", "--data-dir", str(data), "--fake-hw",
            "hgx-h100-8", "--helper-socket", str(helper.socket), "--heartbeat-interval", "1",
            env={**_env(data)}, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            issued = await lab.wait_event("node.session-cert.issued", lambda ev, data: ev.subject == "n1")
            assert json.loads(issued.data_json)["serial"]
        finally:
            node.terminate()
            _, err = await node.communicate()
        assert b"Traceback" not in err, err.decode()[-2000:]
