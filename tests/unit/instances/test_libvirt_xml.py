"""The libvirt runtime's domain XML: every DomainConfig concern, and bc's metadata read back (a domain that is not
bc's, or only claims to be, is unmanaged)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.instances import libvirt_xml
from agent.instances.libvirt_xml import NAMESPACE, domain_xml, read_domain
from agent.instances.runtime import DomainConfig, NicConfig, PlacementConfig, RuntimeFailure, VolumeConfig

D = Path("/var/lib/bc/libvirt/vm1")
NS = {"bc": NAMESPACE}


def config(**changes: object) -> DomainConfig:
    base: dict[str, object] = {
        "id": "vm1",
        "vcpus": 2,
        "memory_mib": 512,
        "kernel": Path("/var/lib/bc/instance-boot/vmlinuz"),
        "initrd": Path("/var/lib/bc/instance-boot/initrd"),
        "cmdline": "console=ttyS0 quiet",
        "allocation_id": "al-1",
    }
    return DomainConfig(**(base | changes))  # type: ignore[arg-type]


def parsed(c: DomainConfig, domain_type: str = "qemu", **kw: object) -> ET.Element:
    return ET.fromstring(domain_xml(c, domain_type, D, **kw))  # type: ignore[arg-type]


def test_the_base_boots_the_kernel_directly_with_acpi_and_a_console_to_a_file() -> None:
    dom = parsed(config())
    assert dom.get("type") == "qemu"
    assert dom.findtext("name") == "vm1" and dom.find("uuid") is None
    assert (dom.findtext("memory"), dom.find("memory").get("unit")) == ("512", "MiB")  # type: ignore[union-attr]
    assert dom.findtext("currentMemory") == "512" and dom.findtext("vcpu") == "2"
    assert dom.find("vcpu").get("cpuset") is None  # type: ignore[union-attr]
    assert dom.findtext("os/kernel") == "/var/lib/bc/instance-boot/vmlinuz"
    assert dom.findtext("os/initrd") == "/var/lib/bc/instance-boot/initrd"
    assert dom.findtext("os/cmdline") == "console=ttyS0 quiet"
    assert dom.find("features/acpi") is not None and dom.find("cpu") is None  # TCG: no host CPU to pass
    serial = dom.find("devices/serial")
    assert serial is not None and serial.get("type") == "file"
    assert serial.find("source").get("path") == str(D / "console.log")  # type: ignore[union-attr]
    assert dom.find("sysinfo") is None and dom.findall("devices/disk") == [] and dom.find("devices/interface") is None


def test_kvm_passes_the_host_cpu_and_an_unknown_type_is_refused() -> None:
    dom = parsed(config(), "kvm")
    assert dom.get("type") == "kvm" and dom.find("cpu").get("mode") == "host-passthrough"  # type: ignore[union-attr]
    with pytest.raises(RuntimeFailure, match="libvirt domain type 'xen' is not one of kvm, qemu"):
        domain_xml(config(), "xen", D)


def test_a_redefinition_keeps_the_uuid_of_the_one_it_replaces() -> None:
    assert parsed(config(), uuid="5f1e0d4c-0000-4000-8000-000000000001").findtext("uuid") == (
        "5f1e0d4c-0000-4000-8000-000000000001"
    )


def test_no_kernel_means_no_direct_boot() -> None:
    dom = parsed(config(kernel=None, initrd=None, disk=Path("/d/disk.qcow2")))
    assert dom.find("os/kernel") is None and dom.find("os/cmdline") is None and dom.findtext("os/type") == "hvm"


def test_the_root_disk_and_the_volumes_in_order_with_their_serials() -> None:
    vols = (VolumeConfig("data", Path("/v/data.raw"), "bc-data"), VolumeConfig("ro", Path("/v/ro.raw"), "bc-ro", True))
    disks = parsed(config(disk=Path("/d/disk.qcow2"), volumes=vols)).findall("devices/disk")
    assert [d.find("target").get("dev") for d in disks] == ["vda", "vdb", "vdc"]  # type: ignore[union-attr]
    assert [d.find("source").get("file") for d in disks] == ["/d/disk.qcow2", "/v/data.raw", "/v/ro.raw"]  # type: ignore[union-attr]
    assert [d.find("driver").get("type") for d in disks] == ["qcow2", "raw", "raw"]  # type: ignore[union-attr]
    assert [d.findtext("serial") for d in disks] == [None, "bc-data", "bc-ro"]
    assert [d.find("readonly") is not None for d in disks] == [False, False, True]
    # without a root disk, the first volume is vda
    only = parsed(config(volumes=vols[:1])).findall("devices/disk")
    assert [d.find("target").get("dev") for d in only] == ["vda"]  # type: ignore[union-attr]


@given(st.integers(0, 2000), st.integers(0, 2000))
def test_virtio_disk_names_are_distinct(a: int, b: int) -> None:
    assert (libvirt_xml._vd(a) == libvirt_xml._vd(b)) == (a == b)
    assert libvirt_xml._vd(a)[2:].isalpha()


def test_nics_are_virtio_on_the_taps_bc_named_on_their_bridge_or_bare() -> None:
    nics = (NicConfig("bc1a2b3c4d0", "br-inst", "52:54:00:00:00:01"), NicConfig("bc1a2b3c4d1", "", "52:54:00:00:00:02"))
    ifaces = parsed(config(nics=nics)).findall("devices/interface")
    assert [i.get("type") for i in ifaces] == ["bridge", "ethernet"]
    assert [i.find("target").get("dev") for i in ifaces] == ["bc1a2b3c4d0", "bc1a2b3c4d1"]  # type: ignore[union-attr]
    assert [i.find("mac").get("address") for i in ifaces] == ["52:54:00:00:00:01", "52:54:00:00:00:02"]  # type: ignore[union-attr]
    assert ifaces[0].find("source").get("bridge") == "br-inst" and ifaces[1].find("source") is None  # type: ignore[union-attr]
    assert {i.find("model").get("type") for i in ifaces} == {"virtio"}  # type: ignore[union-attr]


def test_gpus_are_vfio_hostdevs_by_pci_address_which_libvirt_does_not_rebind() -> None:
    hostdevs = parsed(config(gpus=("0000:3b:00.0", "0001:af:1f.7"))).findall("devices/hostdev")
    assert [(h.get("type"), h.get("managed"), h.find("driver").get("name")) for h in hostdevs] == [  # type: ignore[union-attr]
        ("pci", "no", "vfio"),
        ("pci", "no", "vfio"),
    ]
    addresses = [h.find("source/address").attrib for h in hostdevs]  # type: ignore[union-attr]
    assert addresses == [
        {"domain": "0x0000", "bus": "0x3b", "slot": "0x00", "function": "0x0"},
        {"domain": "0x0001", "bus": "0xaf", "slot": "0x1f", "function": "0x7"},
    ]


@pytest.mark.parametrize(
    "address", ["GPU-1234", "0000:3b:00", "0000:3b:20.0", "0000:3b:00.8", "00:3b:00.0", "0000:zz:00.0"]
)
def test_a_gpu_that_is_not_a_pci_address_is_refused(address: str) -> None:
    with pytest.raises(RuntimeFailure, match=r"is not a PCI address \(0000:3b:00.0\)"):
        domain_xml(config(gpus=(address,)), "qemu", D)


def test_placement_cpuset_strict_numa_memfd_huge_pages_and_no_balloon() -> None:
    placed = PlacementConfig(cpus=(2, 3, 8), mems=(0, 1), hugepage_mib=1024)
    dom = parsed(config(placement=placed))
    assert dom.find("vcpu").get("cpuset") == "2-3,8"  # type: ignore[union-attr]
    assert dom.find("cputune") is None  # 3 CPUs for 2 vCPUs: they float over the cpuset
    assert dom.find("numatune/memory").attrib == {"mode": "strict", "nodeset": "0-1"}  # type: ignore[union-attr]
    assert dom.find("memoryBacking/hugepages/page").attrib == {"size": "1024", "unit": "MiB"}  # type: ignore[union-attr]
    assert dom.find("memoryBacking/source").get("type") == "memfd"  # type: ignore[union-attr]
    assert dom.find("memoryBacking/locked") is None  # never swapped anyway; libvirt would lift the memlock limit
    assert dom.find("devices/memballoon").attrib == {"model": "none"}  # type: ignore[union-attr]


def test_as_many_cpus_as_vcpus_pins_each_vcpu_to_one() -> None:
    dom = parsed(config(vcpus=3, placement=PlacementConfig(cpus=(4, 6, 7))))
    assert dom.find("vcpu").get("cpuset") == "4,6-7"  # type: ignore[union-attr]
    assert [p.attrib for p in dom.findall("cputune/vcpupin")] == [
        {"vcpu": "0", "cpuset": "4"},
        {"vcpu": "1", "cpuset": "6"},
        {"vcpu": "2", "cpuset": "7"},
    ]


def test_no_placement_adds_nothing_and_a_balloon_only_when_asked() -> None:
    dom = parsed(config())
    assert dom.find("numatune") is None and dom.find("memoryBacking") is None and dom.find("cputune") is None
    assert dom.find("devices/memballoon").get("model") == "none"  # type: ignore[union-attr]
    mb = parsed(config(placement=PlacementConfig(balloon=True))).find("devices/memballoon")
    assert mb is not None and (mb.get("model"), mb.get("freePageReporting")) == ("virtio", "on")
    assert mb.find("stats").get("period") == "2"  # type: ignore[union-attr]


def test_user_data_is_fw_cfg_opt_bc_user_data() -> None:
    dom = parsed(config(), user_data_file=Path("/run/bc/user-data/vm1"))
    assert dom.find("sysinfo").get("type") == "fwcfg"  # type: ignore[union-attr]
    assert dom.find("sysinfo/entry").attrib == {"name": "opt/bc/user-data", "file": "/run/bc/user-data/vm1"}  # type: ignore[union-attr]
    assert "user-data" not in (dom.findtext("metadata/bc:instance/bc:record", namespaces=NS) or "")


def test_the_metadata_marks_it_bcs_with_id_and_allocation() -> None:
    mark = parsed(config()).find("metadata/bc:instance", NS)
    assert mark is not None and (mark.get("id"), mark.get("allocation")) == ("vm1", "al-1")


nics = st.builds(
    NicConfig, st.text("abc01", min_size=1, max_size=15), st.text("br0", max_size=4), st.just("52:54:00:00:00:01")
)
volumes = st.builds(VolumeConfig, st.just("v"), st.just(Path("/v/v.raw")), st.just("s"), st.booleans())
configs = st.builds(
    DomainConfig,
    id=st.from_regex(r"[a-z0-9][a-z0-9-]{0,20}", fullmatch=True),
    vcpus=st.integers(1, 256),
    memory_mib=st.integers(16, 4 * 1024 * 1024),
    kernel=st.one_of(st.none(), st.just(Path("/b/vmlinuz"))),
    initrd=st.one_of(st.none(), st.just(Path("/b/initrd"))),
    cmdline=st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=60),
    allocation_id=st.text("abc-01", max_size=8),
    disk=st.one_of(st.none(), st.just(Path("/d/disk.qcow2"))),
    nics=st.lists(nics, max_size=2).map(tuple),
    volumes=st.lists(volumes, max_size=2).map(tuple),
    gpus=st.lists(st.just("0000:3b:00.0"), max_size=1).map(tuple),
    placement=st.builds(
        PlacementConfig,
        cpus=st.lists(st.integers(0, 63), max_size=4, unique=True).map(lambda c: tuple(sorted(c))),
        mems=st.lists(st.integers(0, 3), max_size=2, unique=True).map(lambda c: tuple(sorted(c))),
        hugepage_mib=st.sampled_from([0, 2, 1024]),
        balloon=st.booleans(),
    ),
)  # fmt: skip


@given(configs, st.sampled_from(["kvm", "qemu"]))
def test_bcs_domain_reads_back_as_the_config_it_was_built_from(c: DomainConfig, domain_type: str) -> None:
    read = read_domain(domain_xml(c, domain_type, D, user_data_file=Path("/run/u")))
    assert read.config == c
    assert (read.name, read.vcpus, read.memory_mib) == (c.id, c.vcpus, c.memory_mib)


FOREIGN = """<domain type='kvm'><name>legacy</name><memory unit='KiB'>2097152</memory><vcpu>4</vcpu>
<os><type>hvm</type></os><metadata><x:app xmlns:x='https://example.com/app'>mine</x:app></metadata></domain>"""


def test_a_foreign_domain_is_unmanaged_with_its_size() -> None:
    read = read_domain(FOREIGN)
    assert (read.name, read.vcpus, read.memory_mib, read.config) == ("legacy", 4, 2048, None)


def _with_record(name: str, mark_id: str, record: object, marks: int = 1) -> str:
    mark = (
        f"<bc:instance xmlns:bc='{NAMESPACE}' id='{mark_id}'><bc:record>{json.dumps(record)}</bc:record></bc:instance>"
    )
    size = "<memory unit='GiB'>1</memory>"
    return f"<domain type='kvm'><name>{name}</name>{size}<metadata>{mark * marks}</metadata></domain>"


@pytest.mark.parametrize(
    "xml",
    [
        _with_record("vm2", "vm1", {"id": "vm1", "vcpus": 1}),  # a mark copied onto another domain
        _with_record("vm1", "vm1", {"id": "vm2", "vcpus": 1}),  # a record of another instance
        _with_record("vm1", "vm1", ["not", "a", "record"]),
        _with_record("vm1", "vm1", {"id": "vm1", "nics": "br0"}),  # a record that does not read back
        _with_record("vm1", "vm1", {"id": "vm1"}, marks=2),
        _with_record("", "", {"id": ""}),
        _with_record("vm1", "vm1", {"id": "vm1"}).replace(NAMESPACE, "https://bc.dev/libvirt/2"),
        "<domain type='kvm'><name>vm1</name><metadata><bc:instance xmlns:bc='https://bc.dev/libvirt/1' id='vm1'>"
        "<bc:record>{not json</bc:record></bc:instance></metadata></domain>",
    ],
)
def test_a_domain_that_only_claims_to_be_bcs_is_unmanaged(xml: str) -> None:
    assert read_domain(xml).config is None


def test_a_mark_with_a_good_record_is_bcs() -> None:
    read = read_domain(_with_record("vm1", "vm1", {"id": "vm1", "vcpus": 1, "memory_mib": 64}))
    assert read.config is not None and (read.config.vcpus, read.memory_mib) == (1, 1024)


def test_xml_that_is_not_a_domain_is_a_failure() -> None:
    with pytest.raises(RuntimeFailure, match="does not parse"):
        read_domain("<domain>")
    with pytest.raises(RuntimeFailure, match="a <network>, not a <domain>"):
        read_domain("<network/>")


@pytest.mark.parametrize(
    ("memory", "mib"),
    [("<memory>1048576</memory>", 1024), ("<memory unit='MiB'>300</memory>", 300),
     ("<memory unit='b'>1048576</memory>", 1), ("<memory unit='furlong'>3</memory>", 0), ("<memory>lots</memory>", 0),
     ("", 0)],
)  # fmt: skip
def test_memory_is_read_in_any_unit_libvirt_writes(memory: str, mib: int) -> None:
    assert read_domain(f"<domain><name>x</name>{memory}</domain>").memory_mib == mib


def test_a_live_attach_takes_the_first_free_virtio_name_and_a_detach_finds_the_disk_by_its_file() -> None:
    vols = (VolumeConfig("a", Path("/v/a.raw"), "bc-a"),)
    xml = domain_xml(config(disk=Path("/d/disk.qcow2"), volumes=vols), "qemu", D)
    assert libvirt_xml.free_vd(xml) == "vdc"
    assert libvirt_xml.free_vd(domain_xml(config(), "qemu", D)) == "vda"
    found = libvirt_xml.disk_of(xml, Path("/v/a.raw"))
    assert found is not None and ET.fromstring(found).findtext("serial") == "bc-a"
    assert libvirt_xml.disk_of(xml, Path("/v/other.raw")) is None
    disk = libvirt_xml.volume_disk(VolumeConfig("b", Path("/v/b.raw"), "bc-b", True), "vdc")
    assert (disk.find("target").get("dev"), disk.findtext("serial"), disk.find("readonly") is not None) == (  # type: ignore[union-attr]
        "vdc",
        "bc-b",
        True,
    )
