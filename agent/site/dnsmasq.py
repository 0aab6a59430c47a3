"""dnsmasq, driven by the site agent: the DHCP and TFTP half of the boot server.

Why dnsmasq and not a built-in server (docs/metal.md): DHCP for PXE is a protocol of many clients' quirks
(option 60/93/175, user classes, relays, TFTP block sizes), dnsmasq is packaged by every distribution and
has served PXE for Ironic, MAAS-like tools and home routers for two decades; the agent's part is only the
policy: which MACs it answers (`agent.site.boot_config`). The config is checked with `dnsmasq --test`
before it is used, the process runs in the foreground as the agent's child, a new hosts file is picked up
on SIGHUP, and a changed config restarts it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
from pathlib import Path

from agent.offload import Offload
from agent.site import boot_config
from bc.protocol.pb import spec_pb2

log = logging.getLogger(__name__)

BINARY = "dnsmasq"
STARTUP_S = 1.0
"""How long a just-started dnsmasq is watched for a failed start (it exits at once when it cannot start)."""


class BootServerError(Exception):
    pass


def _write(path: Path, text: str) -> bool:
    """Write `text` if it differs (tmp + rename); whether it changed."""
    try:
        if path.read_text() == text:
            return False
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.new")
    tmp.write_text(text)
    os.replace(tmp, path)
    return True


def _make_dir(path: Path) -> None:
    """The boot directory, 0755: dnsmasq reads it as its own unprivileged user after it starts."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o755)


def _link_ipxe(tftp: Path) -> None:
    tftp.mkdir(parents=True, exist_ok=True)
    tftp.chmod(0o755)
    for name in (boot_config.IPXE_BIOS, boot_config.IPXE_EFI):
        for src in boot_config.IPXE_SOURCES:
            if (src / name).is_file() and not (tftp / name).exists():
                shutil.copyfile(src / name, tftp / name)
                break


async def check_config(conf: Path, binary: str = BINARY) -> str | None:
    """None when `dnsmasq --test` accepts the file, else its complaint."""
    proc = await asyncio.create_subprocess_exec(
        binary, "--test", f"--conf-file={conf}", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await proc.communicate()
    if proc.returncode == 0:
        return None
    return out.decode(errors="replace").strip().splitlines()[-1][:300] if out else f"exit {proc.returncode}"


class Dnsmasq:
    def __init__(self, run_dir: Path, offload: Offload, binary: str = BINARY, log_to: str = "-") -> None:
        """`log_to`: dnsmasq's --log-facility (`-`: its stderr, which is the agent's)."""
        self.run_dir = run_dir
        self.log_to = log_to
        self.conf = run_dir / "dnsmasq.conf"
        self.offload = offload
        self.binary = binary
        self.proc: asyncio.subprocess.Process | None = None
        self._conf_text = ""

    async def apply(self, boot: spec_pb2.SiteBootServer, hosts: str) -> None:
        """Make the running dnsmasq match: config (restart when it changed) and leased MACs (SIGHUP)."""
        text = boot_config.dnsmasq_conf(boot, self.run_dir)
        await self.offload(_make_dir, self.run_dir)
        await self.offload(_link_ipxe, self.run_dir / "tftp")
        hosts_changed = await self.offload(_write, self.run_dir / "leased-macs", hosts)
        if self.proc is not None and self.proc.returncode is not None:
            log.warning("event=site.dnsmasq.exited code=%d: starting it again", self.proc.returncode)
        if text != self._conf_text or self.proc is None or self.proc.returncode is not None:
            await self.offload(_write, self.conf, text)
            why = await check_config(self.conf, self.binary)
            if why is not None:
                raise BootServerError(f"dnsmasq refuses the generated config: {why}")
            await self.stop()
            self.proc = await asyncio.create_subprocess_exec(
                self.binary,
                "--keep-in-foreground",
                f"--conf-file={self.conf}",
                f"--log-facility={self.log_to}",
                stdin=asyncio.subprocess.DEVNULL,
            )
            # dnsmasq checks what --test cannot (the interface, the TFTP root as its unprivileged user) after
            # forking off nothing: in the foreground a failed start is an exit within moments.
            try:
                async with asyncio.timeout(STARTUP_S):
                    code = await self.proc.wait()
            except TimeoutError:
                code = None
            if code is not None:
                self.proc = None
                raise BootServerError(
                    f"dnsmasq exited with code {code} at start (its log says why; the boot directory "
                    f"{self.run_dir} must be readable by dnsmasq's unprivileged user)"
                )
            self._conf_text = text
            log.info("event=site.dnsmasq.started pid=%d interface=%s", self.proc.pid, boot.interface)
        elif hosts_changed:
            self.proc.send_signal(signal.SIGHUP)

    async def stop(self) -> None:
        proc, self.proc = self.proc, None
        self._conf_text = ""
        if proc is None or proc.returncode is not None:
            return
        proc.terminate()
        try:
            async with asyncio.timeout(5):
                await proc.wait()
        except TimeoutError:
            proc.kill()
            await proc.wait()
