"""What a provisioning job does to each machine, decided before it is submitted (pure; docs/metal.md).

`MachinePlan` is everything a step needs that is known at submit: the site node that drives the BMC, the
node ids the ramdisk and the installed OS will join as (each tied to the machine: the job mints their join
tokens for exactly these ids), the ramdisk's kernel and initrd in the site's cache, the image (a URL, or a
cached image by name, served by the site's boot server) and where it goes. What only the machine can tell
(which disk, when `--disk` is not given) is read from the ramdisk's inventory by the job itself.
The plan travels in the job's arguments: it holds no secret (tokens are minted by the steps, in their
transaction, and never stored in the job).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from urllib.parse import urlsplit

from bc.control.metal.views import MachineView
from bc.errors import Conflict, UsageError
from bc.protocol import labels as node_labels
from bc.protocol.pb import spec_pb2

SHA256 = re.compile(r"[0-9a-f]{64}")
NODE_ID = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
DISK = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,31}")
DEFAULT_JOIN_TIMEOUT_S = 1800.0
RAMDISK_SUFFIX = "-ramdisk"


@dataclass(frozen=True)
class Request:
    machines: tuple[str, ...]
    image: str
    sha256: str = ""
    labels: tuple[str, ...] = ()
    ramdisk_kernel_sha256: str = ""
    ramdisk_initrd_sha256: str = ""
    disk: str = ""
    kexec_kernel: str = ""
    kexec_initrd: str = ""
    partition: int = 0
    cmdline: str = ""
    join_timeout_s: float = 0.0
    reprovision_node: str = ""


@dataclass(frozen=True)
class MachinePlan:
    machine: str
    site: str
    ramdisk: str  # the node id the ramdisk joins as
    os_node: str  # the node id the installed OS joins as
    macs: tuple[str, ...] = ()  # its enrolled boot NICs: the ramdisk that joins must report one of them
    labels: dict[str, str] = field(default_factory=dict)
    kernel_sha256: str = ""
    initrd_sha256: str = ""
    image_url: str = ""
    image_sha256: str = ""
    disk: str = ""
    kexec_kernel: str = "/boot/vmlinuz"
    kexec_initrd: str = "/boot/initrd.img"
    partition: int = 1
    cmdline: str = ""
    join_timeout_s: float = DEFAULT_JOIN_TIMEOUT_S

    def params(self) -> dict[str, object]:
        return asdict(self)


def _sha(what: str, text: str) -> str:
    value = text.strip().lower().removeprefix("sha256:")
    if not SHA256.fullmatch(value):
        raise UsageError(f"{what} must be a SHA-256 (64 hex digits), not {text[:80]!r}")
    return value


def node_id_of(machine: str, suffix: str = "") -> str:
    """The node id for a machine's name (lower case), or one sentence why it cannot be one."""
    nid = machine.lower() + suffix
    if not NODE_ID.fullmatch(nid):
        raise UsageError(
            f"machine {machine!r} makes no node id ({nid!r}): name it with at most {63 - len(suffix)} characters"
        )
    return nid


def image_source(req: Request, site: spec_pb2.SiteSection) -> tuple[str, str]:
    """(URL the ramdisk streams, SHA-256): a URL as given (with --sha256), or a cached image by name, served by
    the site's boot server at /images/<sha256> while the machine's lease names it."""
    image = req.image.strip()
    if not image:
        raise UsageError("name the image to deploy: --image NAME (one of the site's cache_images) or --image URL")
    if image.startswith(("http://", "https://")):
        if not req.sha256:
            raise UsageError("an image given by URL needs its digest: --sha256 HEX")
        return image, _sha("--sha256", req.sha256)
    if not site.boot.http_address:
        raise Conflict("the site has no boot server (its section's boot.http_address): it cannot serve the image")
    wanted = _sha("--sha256", req.sha256) if req.sha256 else ""
    for c in site.cache_images:
        name = urlsplit(c.url).path.rsplit("/", 1)[-1]
        if name == image and (not wanted or c.sha256.lower().removeprefix("sha256:") == wanted):
            digest = c.sha256.lower().removeprefix("sha256:")
            return f"http://{site.boot.http_address}/images/{digest}", digest
    raise UsageError(f"the site caches no image named {image!r}: list it in the site section's cache_images first")


def plan(
    req: Request,
    machines: Sequence[MachineView],
    sites: Mapping[str, spec_pb2.SiteSection],
) -> list[MachinePlan]:
    """One plan per machine, in the order asked; one sentence on the first thing that is wrong."""
    if not machines:
        raise UsageError("name at least one machine to provision")
    if not req.ramdisk_kernel_sha256 or not req.ramdisk_initrd_sha256:
        raise UsageError(
            "name the ramdisk's kernel and initrd in the site's cache: --ramdisk-kernel SHA256 --ramdisk-initrd SHA256"
        )
    kernel = _sha("--ramdisk-kernel", req.ramdisk_kernel_sha256)
    initrd = _sha("--ramdisk-initrd", req.ramdisk_initrd_sha256)
    if req.disk and not DISK.fullmatch(req.disk):
        raise UsageError(f"{req.disk!r} is not a disk's kernel name (sda, nvme0n1, …)")
    if not 0 <= req.partition <= 128:
        raise UsageError("--partition must be between 1 and 128")
    if len(req.cmdline) > 2000 or any(c in req.cmdline for c in "\n\r\0\"'"):
        raise UsageError("--cmdline must be one line of at most 2000 characters, without quotes")
    timeout = req.join_timeout_s or DEFAULT_JOIN_TIMEOUT_S
    if not 60 <= timeout <= 86_400:
        raise UsageError("--join-timeout must be between 1m and 24h")
    extra = node_labels.parse_pairs(req.labels)
    if req.reprovision_node and len(machines) != 1:
        raise UsageError("reprovision acts on one node")
    out: list[MachinePlan] = []
    for m in machines:
        site = sites.get(m.site_node)
        if site is None or not any(x.name == m.name for x in site.machines):
            raise Conflict(
                f"machine {m.name} is not in site {m.site_node}'s section yet (its enrollment may await its quorum)"
            )
        url, digest = image_source(req, site)
        out.append(
            MachinePlan(
                machine=m.name,
                site=m.site_node,
                ramdisk=node_id_of(m.name, RAMDISK_SUFFIX),
                os_node=req.reprovision_node or m.node_id or node_id_of(m.name),
                macs=m.macs,
                labels={**m.labels, **extra},
                kernel_sha256=kernel,
                initrd_sha256=initrd,
                image_url=url,
                image_sha256=digest,
                disk=req.disk,
                kexec_kernel=req.kexec_kernel or "/boot/vmlinuz",
                kexec_initrd=req.kexec_initrd or "/boot/initrd.img",
                partition=req.partition or 1,
                cmdline=req.cmdline,
                join_timeout_s=timeout,
            )
        )
    return out
