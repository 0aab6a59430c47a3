"""The boot server's files, rendered from the section and the live leases: pure, no I/O.

The flow (docs/metal.md, "The boot flow"): a machine PXE-boots; dnsmasq answers its DHCP only when its MAC
has a live lease (`dhcp-ignore=tag:!known`, the leased MACs being the only known hosts), hands a PXE ROM
the iPXE binary over TFTP, and hands iPXE (user class `iPXE`) the URL of `boot.ipxe` on the site's HTTP
server; that script chains to `boot/<mac>.ipxe`, which exists only for a live lease and names the lease's
kernel and initramfs under `images/<sha256>`, served from the cache after a fresh digest check.

dnsmasq serves no DNS (`port=0`), names no router (a machine being provisioned reaches the site and
nothing else through it), and binds only the section's interface. The leased MACs live in a hosts
file dnsmasq re-reads on SIGHUP, so a lease set or removed never restarts it.
"""

from __future__ import annotations

from pathlib import Path

from agent.site.leases import Lease
from bc.protocol.pb import spec_pb2

IPXE_BIOS = "undionly.kpxe"
IPXE_EFI = "ipxe.efi"
IPXE_SOURCES = (Path("/usr/lib/ipxe"), Path("/usr/share/ipxe"))
"""Where the OS's `ipxe` package puts the binaries the TFTP root links to."""


def dnsmasq_conf(boot: spec_pb2.SiteBootServer, run_dir: Path) -> str:
    start, end, *mask = boot.dhcp_range.split(",")
    dhcp_range = ",".join([start, end, *mask, "10m"])
    http = boot.http_address
    return "\n".join(
        [
            "# Written by the bc site agent from its site section (docs/metal.md). Do not edit: it is rewritten.",
            "port=0",
            f"interface={boot.interface}",
            "bind-dynamic",
            "no-resolv",
            "no-hosts",
            f"dhcp-range={dhcp_range}",
            f"dhcp-hostsfile={run_dir / 'leased-macs'}",
            "dhcp-ignore=tag:!known",
            "dhcp-option=option:router",
            f"dhcp-leasefile={run_dir / 'dnsmasq.leases'}",
            f"pid-file={run_dir / 'dnsmasq.pid'}",
            "dhcp-match=set:ipxe,175",
            "dhcp-userclass=set:ipxe,iPXE",
            "dhcp-match=set:efi64,option:client-arch,7",
            "dhcp-match=set:efi64,option:client-arch,9",
            "enable-tftp",
            f"tftp-root={run_dir / 'tftp'}",
            f"dhcp-boot=tag:!ipxe,tag:efi64,{IPXE_EFI}",
            f"dhcp-boot=tag:!ipxe,tag:!efi64,{IPXE_BIOS}",
            f"dhcp-boot=tag:ipxe,http://{http}/boot.ipxe",
            "log-dhcp",
            "",
        ]
    )


def leased_macs(live_by_mac: dict[str, Lease]) -> str:
    """dnsmasq's hosts file: one leased MAC a line (the only hosts it answers)."""
    return "".join(f"{mac},set:bc-lease\n" for mac in sorted(live_by_mac))


def chain_script(http_address: str) -> str:
    return f"#!ipxe\nchain http://{http_address}/boot/${{net0/mac}}.ipxe\n"


def machine_script(lease: Lease, http_address: str) -> str:
    base = f"http://{http_address}/images"
    args = f"initrd=initrd {lease.cmdline}".rstrip()
    return (
        "#!ipxe\n"
        f"# lease of {lease.machine}\n"
        f"kernel {base}/{lease.kernel_sha256} {args}\n"
        f"initrd --name initrd {base}/{lease.initrd_sha256}\n"
        "boot\n"
    )
