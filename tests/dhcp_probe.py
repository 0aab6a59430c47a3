"""A DHCP exchange with the site's dnsmasq inside a network namespace of its own (run under `unshare -n`).

    python -m tests.dhcp_probe RUN_DIR LEASED_MAC UNLEASED_MAC

builds a veth pair (`bcsrv` with 10.77.0.1/24, `bccli`), writes the site agent's dnsmasq config for
`bcsrv` (agent.site.boot_config, through agent.site.dnsmasq) with LEASED_MAC as the one live lease, starts
dnsmasq, and sends DHCPDISCOVERs from `bccli` as a PXE ROM and as iPXE for each MAC, in that order:
unleased (PXE), leased (PXE), leased (iPXE). dnsmasq answers in order, so once the leased answers are in,
the unleased one was already decided. Prints one JSON object: each MAC's offers (address and boot file)
and dnsmasq's log lines.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

from agent.offload import to_thread
from agent.site.dnsmasq import Dnsmasq
from bc.protocol.pb import spec_pb2

SERVER_IF, CLIENT_IF = "bcsrv", "bccli"


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True)


def discover(mac: str, xid: int, ipxe: bool) -> bytes:
    chaddr = bytes.fromhex(mac.replace(":", "")) + b"\0" * 10
    head = struct.pack(
        "!BBBBIHH4s4s4s4s16s64s128s",
        1,
        1,
        6,
        0,
        xid,
        0,
        0x8000,
        b"\0" * 4,
        b"\0" * 4,
        b"\0" * 4,
        b"\0" * 4,
        chaddr,
        b"\0" * 64,
        b"\0" * 128,
    )
    opts = b"\x63\x82\x53\x63" + b"\x35\x01\x01"  # magic cookie, DHCPDISCOVER
    opts += b"\x3c\x20PXEClient:Arch:00000:UNDI:002001"  # option 60
    opts += b"\x5d\x02\x00\x00"  # option 93: client arch 0 (BIOS)
    if ipxe:
        opts += b"\x4d\x04iPXE"  # option 77: user class
    opts += b"\x37\x03\x01\x03\x43"  # parameter request list: mask, router, boot file
    return head + opts + b"\xff"


def _checksum(header: bytes) -> int:
    total = sum(struct.unpack(f"!{len(header) // 2}H", header))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def frame(mac: str, dhcp: bytes) -> bytes:
    """The Ethernet frame a PXE ROM sends: from its MAC and 0.0.0.0:68 to broadcast :67 (a raw socket)."""
    udp = struct.pack("!HHHH", 68, 67, 8 + len(dhcp), 0) + dhcp
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0, 64, 17, 0, b"\0" * 4, b"\xff" * 4)
    ip = ip[:10] + struct.pack("!H", _checksum(ip)) + ip[12:]
    return b"\xff" * 6 + bytes.fromhex(mac.replace(":", "")) + b"\x08\x00" + ip + udp


def dhcp_payload(eth: bytes) -> bytes | None:
    """The DHCP message in a frame to UDP port 68, else None."""
    if len(eth) < 42 or eth[12:14] != b"\x08\x00" or eth[23] != 17:
        return None
    ihl = (eth[14] & 0x0F) * 4
    udp = eth[14 + ihl :]
    if struct.unpack("!H", udp[2:4])[0] != 68:
        return None
    return udp[8:]


def parse_offer(data: bytes) -> tuple[int, str, str]:
    xid = struct.unpack("!I", data[4:8])[0]
    yiaddr = socket.inet_ntoa(data[16:20])
    file = data[108:236].split(b"\0", 1)[0].decode()
    i = 240
    while i < len(data) and data[i] != 0xFF:
        code = data[i]
        if code == 0:
            i += 1
            continue
        length = data[i + 1]
        if code == 67:
            file = data[i + 2 : i + 2 + length].split(b"\0", 1)[0].decode()
        i += 2 + length
    return xid, yiaddr, file


async def main(run_dir: Path, leased: str, unleased: str) -> dict[str, object]:
    sh("ip", "link", "set", "lo", "up")
    sh("ip", "link", "add", SERVER_IF, "type", "veth", "peer", "name", CLIENT_IF)
    sh("ip", "addr", "add", "10.77.0.1/24", "dev", SERVER_IF)
    sh("ip", "link", "set", SERVER_IF, "up")
    sh("ip", "link", "set", CLIENT_IF, "up")
    boot = spec_pb2.SiteBootServer(
        interface=SERVER_IF, dhcp_range="10.77.0.10,10.77.0.20", http_address="10.77.0.1:8081"
    )
    log = run_dir / "dnsmasq.log"
    server = Dnsmasq(run_dir, to_thread, log_to=str(log))
    await server.apply(boot, f"{leased},set:bc-lease\n")
    try:
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0800))
        sock.bind((CLIENT_IF, 0))
        sock.settimeout(1.0)
        asks = {1: (unleased, False), 2: (leased, False), 3: (leased, True)}
        offers: dict[str, list[dict[str, str]]] = {leased: [], unleased: []}
        deadline = time.monotonic() + 20
        pending = {2, 3}
        while pending and time.monotonic() < deadline:
            # dnsmasq may not listen yet on the first round: ask again until both leased answers are in.
            for xid, (mac, ipxe) in asks.items():
                if xid in pending or xid == 1:
                    sock.send(frame(mac, discover(mac, xid, ipxe)))
            end = time.monotonic() + 1.0
            while time.monotonic() < end:
                try:
                    data = dhcp_payload(sock.recv(4096))
                except TimeoutError:
                    break
                if data is None or data[0] != 2:  # not a BOOTREPLY
                    continue
                xid, addr, file = parse_offer(data)
                if xid in asks:
                    mac, ipxe = asks[xid]
                    offers[mac].append({"address": addr, "file": file, "ipxe": str(ipxe)})
                    pending.discard(xid)
        return {"offers": offers, "log": log.read_text().splitlines() if log.exists() else []}
    finally:
        await server.stop()


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(Path(sys.argv[1]), sys.argv[2], sys.argv[3]))))
