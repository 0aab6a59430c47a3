"""Two real TCG guests on a bridge, one honest and one spoofing, in the network namespace this runs in.

Run by tests/integration/test_instances_net.py as `unshare -n python -m tests.integration.netns_guests DIR`:
everything it makes (the bridge, the taps, the nftables tables) lives and dies with that private namespace.
It drives the real `instances` converger (qemu runtime with pyroute2 taps, `InstanceNetwork` loading real
nftables rules), watches frames with raw AF_PACKET sockets (the bridge, in promiscuous mode, and each tap,
which sees a guest's frames before the bridge does), and prints one JSON document of what it saw.

The guests (busybox initramfs, the host kernel's virtio modules) set their NIC's MAC and address from the
kernel command line and ping the host, and an address beyond it, every second: the honest one (network
policy NONE: the host only) from the MAC and address its spec gives it, the spoofer from another MAC and
address. Phases:

1. rules loaded: the honest guest's frames to the host reach the bridge and those for beyond it do not; the
   spoofer's are seen on its tap and never on the bridge;
2. the bridge table is flushed: the spoofer's frames now reach the bridge (the observation can see them);
3. the 5-s guard puts the table back (`instance.rules-restored`): they stop again;
4. the instances are deleted: their taps are gone.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

from agent.converge.instances import InstancesConverger
from agent.instances.admission import HostMemory
from agent.instances.net.guard import InstanceNetwork
from agent.instances.net.names import tap_name
from agent.instances.net.taps import NetlinkTaps
from agent.instances.qemu import CONSOLE, PIDFILE, QemuRuntime
from agent.offload import to_thread
from bc.protocol.pb import spec_pb2
from tests.instance_parts import GUEST_CMDLINE, guest
from tests.qemu_guest import LOAD_MODULES, initrd

BRIDGE = "br0"
HOST_IP = "10.0.0.1"
HONEST_MAC, HONEST_IP = "52:54:00:00:00:0a", "10.0.0.10"
SPOOFER_MAC, SPOOFER_IP = "52:54:00:00:00:0b", "10.0.0.11"
FORGED_MAC, FORGED_IP = "52:54:00:00:00:99", "10.0.0.99"
BEYOND_IP = "10.0.1.1"  # off the bridge's subnet, through the host: what network_policy NONE forbids
MODULES = ("virtio_pci", "virtio_net")
INIT = f"""#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t sysfs sysfs /sys
{LOAD_MODULES}
for x in $(/bin/busybox cat /proc/cmdline); do
  case $x in bcmac=*) mac=${{x#bcmac=}};; bcip=*) ip=${{x#bcip=}};; esac
done
/bin/busybox ip link set eth0 address $mac
/bin/busybox ip addr add $ip/24 dev eth0
/bin/busybox ip link set eth0 up
/bin/busybox echo BC-NET-UP $mac $ip
/bin/busybox ip route add default via {HOST_IP}
while true; do
  /bin/busybox ping -c 1 -W 1 {HOST_IP} >/dev/null 2>&1
  /bin/busybox ping -c 1 -W 1 {BEYOND_IP} >/dev/null 2>&1
  /bin/busybox sleep 1
done
"""
ETH_P_ALL = 0x0003
SOL_PACKET, PACKET_ADD_MEMBERSHIP, PACKET_MR_PROMISC = 263, 1, 1


def mac_bytes(mac: str) -> bytes:
    return bytes(int(x, 16) for x in mac.split(":"))


class Watch:
    """Frames on one interface, counted by what they claim: source MAC, and the IPv4 sender (IP or ARP)."""

    def __init__(self, ifname: str, promisc: bool = False) -> None:
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        self.sock.bind((ifname, 0))
        if promisc:
            mreq = struct.pack("iHH8s", socket.if_nametoindex(ifname), PACKET_MR_PROMISC, 0, b"")
            self.sock.setsockopt(SOL_PACKET, PACKET_ADD_MEMBERSHIP, mreq)
        self.sock.setblocking(False)
        self.frames: list[tuple[bytes, str, str]] = []  # (source MAC, IPv4 sender or "", IPv4 destination or "")
        self.changed = asyncio.Event()
        asyncio.get_running_loop().add_reader(self.sock.fileno(), self._read)

    def _read(self) -> None:
        while True:
            try:
                frame = self.sock.recv(2048)
            except BlockingIOError:
                break
            src, ethertype = frame[6:12], frame[12:14]
            sender, target = "", ""
            if ethertype == b"\x08\x00" and len(frame) >= 34:
                sender, target = socket.inet_ntoa(frame[26:30]), socket.inet_ntoa(frame[30:34])
            elif ethertype == b"\x08\x06" and len(frame) >= 42:
                sender = socket.inet_ntoa(frame[28:32])
            self.frames.append((src, sender, target))
        self.changed.set()

    def count(self, mac: str, ip: str = "") -> int:
        return sum(1 for src, sender, _ in self.frames if src == mac_bytes(mac) or (ip and sender == ip))

    def to(self, mac: str, ip: str) -> int:
        """IPv4 packets from `mac` to `ip`."""
        return sum(1 for src, _, target in self.frames if src == mac_bytes(mac) and target == ip)

    async def until(self, predicate: object, within_s: float) -> None:
        assert callable(predicate)
        async with asyncio.timeout(within_s):
            while not predicate():
                self.changed.clear()
                await self.changed.wait()

    def close(self) -> None:
        asyncio.get_running_loop().remove_reader(self.sock.fileno())
        self.sock.close()


def links(prefix: str) -> list[str]:
    """This namespace's interfaces whose name starts with `prefix`, from netlink (`ip -j link`): /sys/class/net
    is the sysfs of the namespace that mounted it, the host's."""
    doc = json.loads(subprocess.run(["ip", "-j", "link", "show"], capture_output=True, check=True).stdout)
    return sorted(str(d["ifname"]) for d in doc if str(d["ifname"]).startswith(prefix))


def vm(iid: str, mac: str, ip: str, kernel_mac: str, kernel_ip: str, policy: str = "") -> spec_pb2.Instance:
    return guest(
        iid,
        cmdline=f"{GUEST_CMDLINE} bcmac={kernel_mac} bcip={kernel_ip}",
        network_policy=policy,
        nics=[spec_pb2.InstanceNic(bridge=BRIDGE, mac=mac, addresses=[f"{ip}/24"])],
    )


async def console_says(root: Path, iid: str, text: str, within_s: float) -> None:
    path = root / iid / CONSOLE
    deadline = time.monotonic() + within_s
    while text not in (path.read_text(errors="replace") if path.exists() else ""):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{iid}'s console never said {text!r}")
        await asyncio.sleep(0.2)  # a file qemu appends to: nothing to wait on but its growth


async def main(work: Path) -> dict[str, object]:
    kernel = sorted(Path("/boot").glob("vmlinuz-*-cloud-amd64"))[-1]  # the test checked it is there
    boot = work / "instance-boot"
    boot.mkdir(parents=True)
    shutil.copy(kernel, boot / "vmlinuz")
    (boot / "initrd").write_bytes(initrd(INIT, kernel, MODULES))
    for argv in (
        ["ip", "link", "set", "lo", "up"],
        ["ip", "link", "add", BRIDGE, "type", "bridge"],
        ["ip", "addr", "add", f"{HOST_IP}/24", "dev", BRIDGE],
        ["ip", "link", "set", BRIDGE, "up"],
    ):
        subprocess.run(argv, check=True)
    root = work / "instances"
    runtime = QemuRuntime(root, to_thread, accel=("tcg",), stop_grace_s=1.0, taps=NetlinkTaps())
    restored = asyncio.Event()

    async def on_restored(body: dict[str, object]) -> None:
        restored.set()

    network = InstanceNetwork(on_restored=on_restored)

    async def memory() -> HostMemory:
        return HostMemory(64 * 1024)

    conv = InstancesConverger({"qemu": runtime}, boot, memory, list, to_thread, network=network)
    honest = vm("honest", HONEST_MAC, HONEST_IP, HONEST_MAC, HONEST_IP, "NONE")  # the host only
    spoofer = vm("spoofer", SPOOFER_MAC, SPOOFER_IP, FORGED_MAC, FORGED_IP)
    out: dict[str, object] = {}
    bridge = Watch(BRIDGE, promisc=True)
    try:
        result = await conv.converge(spec_pb2.InstancesSection(instances=[honest, spoofer]), 1)
        out["converged"] = result.state
        out["states"] = {s.id: s.state for s in conv.statuses}
        out["rules"] = {" ".join(k): n for k, n in network.loaded.counts.items()} if network.loaded else {}
        spoofer_tap = Watch(tap_name("spoofer", 0))
        honest_tap = Watch(tap_name("honest", 0))
        for iid in ("honest", "spoofer"):
            await console_says(root, iid, "BC-NET-UP", 120)
        # Phase 1: the honest guest's pings reach the bridge; the spoofer's forged frames never do.
        await bridge.until(lambda: bridge.count(HONEST_MAC) >= 3, 60)
        await spoofer_tap.until(lambda: spoofer_tap.count(FORGED_MAC) >= 3, 60)
        await honest_tap.until(lambda: honest_tap.to(HONEST_MAC, BEYOND_IP) >= 2, 60)
        out["phase1"] = {
            "honest_on_tap": honest_tap.count(HONEST_MAC),
            "honest_on_bridge": bridge.count(HONEST_MAC, HONEST_IP),
            "honest_to_host_on_bridge": bridge.to(HONEST_MAC, HOST_IP),
            "honest_beyond_on_tap": honest_tap.to(HONEST_MAC, BEYOND_IP),
            "honest_beyond_on_bridge": bridge.to(HONEST_MAC, BEYOND_IP),
            "forged_on_tap": spoofer_tap.count(FORGED_MAC, FORGED_IP),
            "forged_on_bridge": bridge.count(FORGED_MAC, FORGED_IP),
        }
        # Phase 2: someone flushes the bridge table: the forged frames get through (the watch can see them).
        subprocess.run(["nft", "flush", "table", "bridge", "bc_instances"], check=True)
        flushed_at = time.monotonic()
        await bridge.until(lambda: bridge.count(FORGED_MAC, FORGED_IP) >= 1, 30)
        out["phase2_forged_on_bridge"] = bridge.count(FORGED_MAC, FORGED_IP)
        # Phase 3: the guard (every 5 s) puts it back, and says so.
        stopped = asyncio.Event()
        guard = asyncio.create_task(network.run(stopped))
        try:
            async with asyncio.timeout(30):
                await restored.wait()
            out["restored_after_s"] = round(time.monotonic() - flushed_at, 1)
            seen = spoofer_tap.count(FORGED_MAC)
            await spoofer_tap.until(lambda: spoofer_tap.count(FORGED_MAC) >= seen + 1, 30)  # in flight: past
            before = bridge.count(FORGED_MAC, FORGED_IP)
            seen = spoofer_tap.count(FORGED_MAC)
            await spoofer_tap.until(lambda: spoofer_tap.count(FORGED_MAC) >= seen + 3, 30)
            out["phase3"] = {
                "forged_on_tap": spoofer_tap.count(FORGED_MAC) - seen,
                "forged_on_bridge": bridge.count(FORGED_MAC, FORGED_IP) - before,
                "restores": network.restores,
            }
        finally:
            stopped.set()
            await guard
        spoofer_tap.close()
        honest_tap.close()
        # Phase 4: deleted, their taps go with them.
        out["taps_before_delete"] = links("bc")
        gone = [spec_pb2.Instance(), spec_pb2.Instance()]
        for g, i in zip(gone, (honest, spoofer), strict=True):
            g.CopyFrom(i)
            g.state = "DELETED"
        result = await conv.converge(spec_pb2.InstancesSection(instances=gone), 2)
        out["deleted"] = result.state
        out["taps_left"] = links("bc")
        return out
    finally:
        bridge.close()
        for pidfile in root.glob(f"*/{PIDFILE}"):
            try:
                os.kill(int(pidfile.read_text()), signal.SIGKILL)
            except (OSError, ValueError):
                pass


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(Path(sys.argv[1]))), sort_keys=True))
