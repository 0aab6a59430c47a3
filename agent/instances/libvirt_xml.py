"""libvirt's domain XML for one bc domain, built from its `DomainConfig`, and bc's metadata read back. Pure.

`domain_xml` writes one element per concern (boot, disks, volumes, NICs,
GPUs, placement, console, user data), mirroring agent.instances.qemu_argv.
bc marks every domain it defines with an element in its own metadata
namespace (`NAMESPACE`): the instance id, its allocation and bc's record of
the config (runtime.config_record, as JSON). `read_domain` parses a domain's
XML back and trusts nothing in it: a domain is bc's only when that element
is there, names the domain's own name as its id, and holds a record that
runtime.record_config reads back for that id. Every other domain of the
connection is someone else's: listed as unmanaged, never touched.

User data is handed to the guest as qemu fw_cfg `opt/bc/user-data` through
`<sysinfo type='fwcfg'>` (libvirt 6.5 and later): the same file name the qemu
runtime uses, so the guest reads the same
`/sys/firmware/qemu_fw_cfg/by_name/opt/bc/user-data/raw`.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from agent.instances.runtime import DomainConfig, RuntimeFailure, VolumeConfig, config_record, record_config
from bc.protocol import cpulist

NAMESPACE = "https://bc.dev/libvirt/1"
PREFIX = "bc"
USER_DATA_FW_CFG = "opt/bc/user-data"
CONSOLE = "console.log"
DOMAIN_TYPES = ("kvm", "qemu")
"""`kvm`: hardware virtualisation; `qemu`: TCG (no /dev/kvm)."""

ET.register_namespace(PREFIX, NAMESPACE)


@dataclass(frozen=True)
class ReadDomain:
    """What a domain's XML says, as far as bc believes it: `config` only for a domain of bc's."""

    name: str
    vcpus: int
    memory_mib: int
    config: DomainConfig | None


def _sub(parent: ET.Element, tag: str, text: str | None = None, **attrs: str) -> ET.Element:
    el = ET.SubElement(parent, tag, attrs)
    if text is not None:
        el.text = text
    return el


def boot(dom: ET.Element, config: DomainConfig, domain_type: str, uuid: str) -> None:
    """Name (and the UUID of the definition it replaces), memory, vCPUs, the direct kernel boot when there is
    one, ACPI (the power button a stop presses)."""
    _sub(dom, "name", config.id)
    if uuid:
        _sub(dom, "uuid", uuid)
    _sub(dom, "memory", str(config.memory_mib), unit="MiB")
    _sub(dom, "currentMemory", str(config.memory_mib), unit="MiB")
    vcpu = _sub(dom, "vcpu", str(config.vcpus), placement="static")
    if config.placement.cpus:
        vcpu.set("cpuset", cpulist.render(config.placement.cpus))
    os_ = _sub(dom, "os")
    _sub(os_, "type", "hvm", arch="x86_64")
    if config.kernel is not None:
        _sub(os_, "kernel", str(config.kernel))
        if config.initrd is not None:
            _sub(os_, "initrd", str(config.initrd))
        _sub(os_, "cmdline", config.cmdline)
    features = _sub(dom, "features")
    _sub(features, "acpi")
    if domain_type == "kvm":  # a memory snapshot then restores only on the same CPU model (the reference)
        _sub(dom, "cpu", mode="host-passthrough")
    _sub(dom, "on_poweroff", "destroy")
    _sub(dom, "on_reboot", "restart")
    _sub(dom, "on_crash", "destroy")


def placement(dom: ET.Element, config: DomainConfig) -> None:
    """vCPUs pinned one to a CPU when the placement names exactly as many CPUs as vCPUs (else they float over
    the `<vcpu cpuset>` of boot), NUMA nodes in strict mode (the guest's memory only there) and huge pages as a
    memfd (as the qemu runtime
    has them: no hugetlbfs mount to find, only a pool of the page size); the vCPU cpuset is on `<vcpu>`
    (boot). Not `<locked/>`, which the reference names: huge pages are never swapped anyway, and locking makes
    libvirt raise qemu's memlock limit to unlimited, which a host may refuse (this one does)."""
    p = config.placement
    if p.cpus and len(p.cpus) == config.vcpus:  # exactly one CPU per vCPU: each pinned (the reference's vcpupin)
        cputune = _sub(dom, "cputune")
        for vcpu, cpu in enumerate(p.cpus):
            _sub(cputune, "vcpupin", vcpu=str(vcpu), cpuset=str(cpu))
    if p.mems:
        numatune = _sub(dom, "numatune")
        _sub(numatune, "memory", mode="strict", nodeset=cpulist.render(p.mems))
    if p.hugepage_mib:
        backing = _sub(dom, "memoryBacking")
        pages = _sub(backing, "hugepages")
        _sub(pages, "page", size=str(p.hugepage_mib), unit="MiB")
        _sub(backing, "source", type="memfd")


def disks(devices: ET.Element, config: DomainConfig) -> None:
    """The root disk (a qcow2 overlay, or a restored flat one) as the first virtio disk."""
    if config.disk is None:
        return
    disk = _sub(devices, "disk", type="file", device="disk")
    _sub(disk, "driver", name="qemu", type=config.disk_format, cache="none", io="threads")
    _sub(disk, "source", file=str(config.disk))
    _sub(disk, "target", dev="vda", bus="virtio")


def volumes(devices: ET.Element, config: DomainConfig) -> None:
    """Persistent volumes after the root disk (vdb, vdc, …), raw, each with its serial."""
    first = 1 if config.disk is not None else 0
    for i, v in enumerate(config.volumes, start=first):
        devices.append(volume_disk(v, _vd(i)))


def volume_disk(v: VolumeConfig, dev: str) -> ET.Element:
    """One volume's `<disk>` (also what a live attach hands libvirt)."""
    disk = ET.Element("disk", type="file", device="disk")
    _sub(disk, "driver", name="qemu", type="raw", cache="none", io="threads")
    _sub(disk, "source", file=str(v.path))
    _sub(disk, "target", dev=dev, bus="virtio")
    _sub(disk, "serial", v.serial)
    if v.read_only:
        _sub(disk, "readonly")
    return disk


def free_vd(xml: str) -> str:
    """The first virtio disk name a domain's (live) XML does not use yet."""
    used = {t.get("dev") for t in ET.fromstring(xml).iterfind("devices/disk/target")}
    return next(_vd(i) for i in range(len(used) + 1) if _vd(i) not in used)


def disk_of(xml: str, path: Path) -> str | None:
    """The `<disk>` of a domain's (live) XML whose source is `path`, as XML; None when it has none."""
    for disk in ET.fromstring(xml).iterfind("devices/disk"):
        source = disk.find("source")
        if source is not None and source.get("file") == str(path):
            return ET.tostring(disk, encoding="unicode")
    return None


def _vd(index: int) -> str:
    """virtio disk names: vda … vdz, then vdaa …"""
    letters = ""
    n = index + 1
    while n:
        n, r = divmod(n - 1, 26)
        letters = chr(ord("a") + r) + letters
    return "vd" + letters


def nics(devices: ET.Element, config: DomainConfig) -> None:
    """Virtio NICs on the taps bc named (so its rules exist before the tap): on their bridge, or a bare tap
    (`ethernet`) when the NIC names none."""
    for n in config.nics:
        iface = _sub(devices, "interface", type="bridge" if n.bridge else "ethernet")
        if n.mac:
            _sub(iface, "mac", address=n.mac)
        if n.bridge:
            _sub(iface, "source", bridge=n.bridge)
        _sub(iface, "target", dev=n.tap)
        _sub(iface, "model", type="virtio")


def gpus(devices: ET.Element, config: DomainConfig) -> None:
    """Whole GPUs by PCI address, passed through with VFIO. `managed='no'`: bc binds them to vfio-pci before
    the start and hands them back after, so libvirt must not rebind them itself."""
    for address in config.gpus:
        domain, bus, slot, function = _pci(address, config.id)
        hostdev = _sub(devices, "hostdev", mode="subsystem", type="pci", managed="no")
        source = _sub(hostdev, "source")
        _sub(source, "address", domain=domain, bus=bus, slot=slot, function=function)
        _sub(hostdev, "driver", name="vfio")


def _pci(address: str, iid: str) -> tuple[str, str, str, str]:
    """'0000:3b:00.0' as libvirt's hex fields; RuntimeFailure for anything else."""
    try:
        dom, bus, rest = address.split(":")
        slot, function = rest.split(".")
        values = (int(dom, 16), int(bus, 16), int(slot, 16), int(function, 16))
    except ValueError:
        raise RuntimeFailure(f"domain {iid}'s GPU {address!r} is not a PCI address (0000:3b:00.0)") from None
    if len(dom) != 4 or len(bus) != 2 or len(slot) != 2 or len(function) != 1 or values[2] > 0x1F or values[3] > 7:
        raise RuntimeFailure(f"domain {iid}'s GPU {address!r} is not a PCI address (0000:3b:00.0)")
    return (f"0x{values[0]:04x}", f"0x{values[1]:02x}", f"0x{values[2]:02x}", f"0x{values[3]:x}")


def balloon(devices: ET.Element, config: DomainConfig) -> None:
    """A virtio balloon (stats every 2 s, free page reporting) only when the placement asks for one; else
    none at all, since libvirt adds one by default and a guest without one is never ballooned."""
    if not config.placement.balloon:
        _sub(devices, "memballoon", model="none")
        return
    mb = _sub(devices, "memballoon", model="virtio", freePageReporting="on")
    _sub(mb, "stats", period="2")


def console(devices: ET.Element, directory: Path) -> None:
    """The serial console to a file in the domain's directory, this boot's only (as the qemu runtime's); no USB
    controller, which libvirt would add by default."""
    _sub(devices, "controller", type="usb", model="none")
    serial = _sub(devices, "serial", type="file")
    _sub(serial, "source", path=str(directory / CONSOLE), append="off")
    _sub(serial, "target", port="0")


def user_data(dom: ET.Element, path: Path | None) -> None:
    """The guest reads /sys/firmware/qemu_fw_cfg/by_name/opt/bc/user-data/raw."""
    if path is None:
        return
    sysinfo = _sub(dom, "sysinfo", type="fwcfg")
    _sub(sysinfo, "entry", name=USER_DATA_FW_CFG, file=str(path))


def metadata(dom: ET.Element, config: DomainConfig) -> None:
    """bc's mark of ownership: the id, its allocation and bc's record (what a start rebuilds the XML from)."""
    meta = _sub(dom, "metadata")
    mark = _sub(meta, f"{{{NAMESPACE}}}instance", id=config.id, allocation=config.allocation_id)
    _sub(mark, f"{{{NAMESPACE}}}record", json.dumps(config_record(config), sort_keys=True))


def domain_xml(
    config: DomainConfig, domain_type: str, directory: Path, *, uuid: str = "", user_data_file: Path | None = None
) -> str:
    """The whole domain definition; `uuid`: the one of the definition it replaces (libvirt refuses a second
    domain of the same name with another)."""
    if domain_type not in DOMAIN_TYPES:
        raise RuntimeFailure(f"libvirt domain type {domain_type!r} is not one of {', '.join(DOMAIN_TYPES)}")
    dom = ET.Element("domain", type=domain_type)
    boot(dom, config, domain_type, uuid)
    metadata(dom, config)
    placement(dom, config)
    user_data(dom, user_data_file)
    devices = _sub(dom, "devices")
    disks(devices, config)
    volumes(devices, config)
    nics(devices, config)
    gpus(devices, config)
    console(devices, directory)
    balloon(devices, config)
    return ET.tostring(dom, encoding="unicode")


def read_domain(xml: str) -> ReadDomain:
    """A domain's XML (libvirt's own, or anyone's) read back: its name and size, and bc's config only when it
    is bc's (RuntimeFailure: not a domain at all)."""
    try:
        dom = ET.fromstring(xml)
    except ET.ParseError as e:
        raise RuntimeFailure(f"libvirt answered XML that does not parse: {e}") from None
    if dom.tag != "domain":
        raise RuntimeFailure(f"libvirt answered a <{dom.tag}>, not a <domain>")
    name = (dom.findtext("name") or "").strip()
    return ReadDomain(name, _number(dom.findtext("vcpu")), _memory_mib(dom.find("memory")), _config(dom, name))


def _config(dom: ET.Element, name: str) -> DomainConfig | None:
    marks = dom.findall(f"metadata/{{{NAMESPACE}}}instance")
    if len(marks) != 1 or marks[0].get("id") != name or not name:
        return None
    text = marks[0].findtext(f"{{{NAMESPACE}}}record") or ""
    try:
        record = json.loads(text)
    except ValueError:
        return None
    if not isinstance(record, dict) or record.get("id") != name:
        return None
    try:
        return record_config(record)
    except RuntimeFailure:
        return None


def _number(text: str | None) -> int:
    try:
        return max(0, int((text or "").strip()))
    except ValueError:
        return 0


_UNITS_KIB = {"b": 1 / 1024, "bytes": 1 / 1024, "k": 1, "kib": 1, "kb": 1000 / 1024, "m": 1024, "mib": 1024}
_UNITS_KIB |= {"mb": 1000**2 / 1024, "g": 1024**2, "gib": 1024**2, "gb": 1000**3 / 1024}


def _memory_mib(el: ET.Element | None) -> int:
    """libvirt's `<memory unit=…>` in MiB (its default unit is KiB)."""
    if el is None:
        return 0
    factor = _UNITS_KIB.get((el.get("unit") or "KiB").lower())
    if factor is None:
        return 0
    return int(_number(el.text) * factor) // 1024
