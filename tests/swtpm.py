"""A software TPM (swtpm) for the tests that drive a real one: manufactured with an endorsement key certificate
by swtpm's own local CA, all of it under the test's directory, and reached over TCP or a unix socket.

`manufacture` runs `swtpm_setup --create-ek-cert` with a configuration of its own (the local CA's state, keys and
serial in `<dir>/ek-ca`, never /var/lib/swtpm-localca); `start` runs `swtpm socket --daemon` (it returns once the
TPM listens, so nothing polls) and `Swtpm.stop` waits on the process's pidfd.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509


@dataclass
class Swtpm:
    tcti: str
    pid: int

    async def tool(self, *argv: str) -> None:
        """Run one tpm2-tools command against this TPM, as an operator would by hand."""
        proc = await asyncio.create_subprocess_exec(
            *argv, env={**os.environ, "TPM2TOOLS_TCTI": self.tcti}, stderr=asyncio.subprocess.PIPE
        )
        _, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()

    async def stop(self) -> None:
        """SIGTERM, then wait for the exit on a pidfd (an event, not a poll)."""
        try:
            fd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            return
        try:
            os.kill(self.pid, signal.SIGTERM)
            gone = asyncio.Event()
            loop = asyncio.get_running_loop()
            loop.add_reader(fd, gone.set)
            try:
                async with asyncio.timeout(10):
                    await gone.wait()
            finally:
                loop.remove_reader(fd)
        finally:
            os.close(fd)


@dataclass(frozen=True)
class EkCa:
    """swtpm's local CA, as manufacturing left it: the root and the issuer of the EK certificates."""

    root: x509.Certificate
    issuer: x509.Certificate

    def pem(self) -> bytes:
        from cryptography.hazmat.primitives.serialization import Encoding

        return self.issuer.public_bytes(Encoding.PEM) + self.root.public_bytes(Encoding.PEM)


async def manufacture(state: Path, work: Path) -> EkCa:
    """A new TPM in `state` with RSA and ECC EKs and their certificates, issued by a local CA kept in `work`."""
    ca = work / "ek-ca"
    ca.mkdir(parents=True, exist_ok=True)
    state.mkdir(parents=True, exist_ok=True)
    (work / "localca.conf").write_text(
        f"statedir = {ca}\nsigningkey = {ca}/signkey.pem\nissuercert = {ca}/issuercert.pem\n"
        f"certserial = {ca}/certserial\n"
    )
    (work / "localca.options").write_text("")
    (work / "swtpm_setup.conf").write_text(
        "create_certs_tool = /usr/bin/swtpm_localca\n"
        f"create_certs_tool_config = {work}/localca.conf\n"
        f"create_certs_tool_options = {work}/localca.options\n"
        "active_pcr_banks = sha256\n"
    )
    proc = await asyncio.create_subprocess_exec(
        "swtpm_setup", "--tpm2", "--tpmstate", str(state), "--create-ek-cert", "--overwrite",
        "--config", str(work / "swtpm_setup.conf"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await proc.communicate()
    assert proc.returncode == 0, out.decode()
    return EkCa(
        x509.load_pem_x509_certificate((ca / "swtpm-localca-rootca-cert.pem").read_bytes()),
        x509.load_pem_x509_certificate((ca / "issuercert.pem").read_bytes()),
    )


def _free_port_pair() -> int:
    """A port P with P+1 free too (the swtpm TCTI dials P for commands and P+1 for control)."""
    while True:
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = int(a.getsockname()[1])
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
        return port


async def start(state: Path, unix_dir: Path | None = None) -> Swtpm:
    """swtpm on the TPM in `state`: on a unix socket in `unix_dir` (`tpm`, with `tpm.ctrl` beside it, which the
    swtpm TCTI's `path=` dials), or on a free pair of TCP ports of 127.0.0.1."""
    pid_file = state / "pid"
    err = b""
    for _ in range(5):  # a port taken between the check and swtpm's bind: another pair
        if unix_dir is not None:
            path = unix_dir / "tpm"
            where = ["--server", f"type=unixio,path={path}", "--ctrl", f"type=unixio,path={path}.ctrl"]
            tcti = f"swtpm:path={unix_dir / 'tpm'}"
        else:
            port = _free_port_pair()
            where = [
                "--server", f"type=tcp,port={port},bindaddr=127.0.0.1",
                "--ctrl", f"type=tcp,port={port + 1},bindaddr=127.0.0.1",
            ]  # fmt: skip
            tcti = f"swtpm:host=127.0.0.1,port={port}"
        proc = await asyncio.create_subprocess_exec(
            "swtpm", "socket", "--tpm2", "--daemon", "--pid", f"file={pid_file}", "--tpmstate", f"dir={state}",
            *where, "--flags", "not-need-init,startup-clear",
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await proc.communicate()
        if proc.returncode == 0:
            return Swtpm(tcti, int(pid_file.read_text()))
    raise AssertionError(f"swtpm did not start: {err.decode()}")
