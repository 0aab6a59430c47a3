"""The disk half of the instances section's rules: tenant images, persistent volumes, and what an instance
says of them (docs/instances.md, "Images and volumes"). Pure: no I/O.

Called from `bc.protocol.instance_rules` (one instance, one section), so the control plane refuses a bad
section whole and the node fails only the instance that breaks a rule.

* An image (`InstancesSection.images`) is a name (1-63 of `a-z 0-9 . _ -`), an `https://` URL, the
  SHA-256 of its bytes (64 lowercase hex) and a format, `qcow2` or `raw`. Names are unique.
* A volume (`InstancesSection.volumes`) is an id (1-80 of `A-Z a-z 0-9 _ -`: it names a file on the
  node), a serial (1-20 of `a-z 0-9 -`: the guest finds it at `/dev/disk/by-id/virtio-<serial>`) and a
  size, a positive multiple of 512 bytes. Ids and serials are unique.
* An instance boots a kernel, an image or a snapshot (`restore_from`, never with an image); a kernel with an
  image boots with the image's disk as vda.
  `disk_size_bytes` needs an image and is a multiple of 512. Its `volumes` name volumes of the section,
  each at most once, at most `MAX_VOLUMES`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final
from urllib.parse import urlsplit

from bc.protocol.pb import spec_pb2

IMAGE_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
SHA256 = re.compile(r"[0-9a-f]{64}")
URL_TEXT = re.compile(r"[\x21-\x7e]{1,2048}")
FORMATS: tuple[str, ...] = ("qcow2", "raw")
VOLUME_ID = re.compile(r"[A-Za-z0-9_-]{1,80}")
SERIAL = re.compile(r"[a-z0-9-]{1,20}")
SECTOR: Final = 512
MAX_DISK_BYTES: Final = 64 << 40  # 64 TiB: far beyond a node's disks, well inside qemu's and int64's range
MAX_VOLUMES: Final = 16
MAX_IMAGES: Final = 64
MAX_SECTION_VOLUMES: Final = 1024


class DiskRuleError(ValueError):
    """A field breaks a rule: `field` names it, `why` says why in one clause (as InstanceRuleError)."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"{field} {why}")
        self.field, self.why = field, why


def _size_why(n: int, what: str) -> str | None:
    if n <= 0 or n % SECTOR or n > MAX_DISK_BYTES:
        return f"must be a positive multiple of {SECTOR} bytes up to {MAX_DISK_BYTES}, not {n}"
    return None


def check_image(img: spec_pb2.TenantImage, field: str) -> None:
    if not IMAGE_NAME.fullmatch(img.name):
        raise DiskRuleError(f"{field}.name", f"{img.name!r} is not an image name (1-63 of a-z 0-9 . _ -)")
    parts = urlsplit(img.url) if URL_TEXT.fullmatch(img.url) else None
    if parts is None or parts.scheme != "https" or not parts.hostname:
        raise DiskRuleError(
            f"{field}.url", f"{img.url[:80]!r} is not an https:// URL; images are fetched over https only"
        )
    if not SHA256.fullmatch(img.sha256):
        raise DiskRuleError(f"{field}.sha256", "must be 64 lowercase hex digits")
    if img.format not in FORMATS:
        raise DiskRuleError(f"{field}.format", f"must be one of {', '.join(FORMATS)}, not {img.format!r}")


def check_volume(vol: spec_pb2.Volume, field: str) -> None:
    if not VOLUME_ID.fullmatch(vol.id):
        raise DiskRuleError(f"{field}.id", f"{vol.id[:90]!r} is not a volume id (1-80 of A-Z a-z 0-9 _ -)")
    if not SERIAL.fullmatch(vol.serial):
        raise DiskRuleError(f"{field}.serial", f"{vol.serial[:30]!r} is not a serial (1-20 of a-z 0-9 -)")
    why = _size_why(vol.size_bytes, "size")
    if why:
        raise DiskRuleError(f"{field}.size_bytes", why)


def check_instance_disks(inst: spec_pb2.Instance, field: str) -> None:
    """The instance's own disk fields (not what they name: `check_refs`)."""
    if inst.image and not IMAGE_NAME.fullmatch(inst.image):
        raise DiskRuleError(f"{field}.image", f"{inst.image!r} is not an image name (1-63 of a-z 0-9 . _ -)")
    restores = inst.HasField("restore_from")
    if inst.image and restores:
        raise DiskRuleError(f"{field}.image", "is set and so is restore_from: an instance boots one or the other")
    if not inst.image and not inst.kernel and not restores:
        raise DiskRuleError(
            f"{field}.kernel", "is empty and so is image: an instance boots a kernel, an image or a snapshot"
        )
    if inst.disk_size_bytes:
        if not inst.image:
            raise DiskRuleError(f"{field}.disk_size_bytes", "needs an image: it sizes the image's overlay")
        why = _size_why(inst.disk_size_bytes, "disk")
        if why:
            raise DiskRuleError(f"{field}.disk_size_bytes", why)
    if len(inst.volumes) > MAX_VOLUMES:
        raise DiskRuleError(f"{field}.volumes", f"attaches {len(inst.volumes)} volumes, more than {MAX_VOLUMES}")
    seen: set[str] = set()
    for j, a in enumerate(inst.volumes):
        if not VOLUME_ID.fullmatch(a.volume):
            raise DiskRuleError(f"{field}.volumes[{j}].volume", f"{a.volume[:90]!r} is not a volume id")
        if a.volume in seen:
            raise DiskRuleError(f"{field}.volumes[{j}].volume", f"{a.volume!r} is attached twice")
        seen.add(a.volume)


def check_refs(inst: spec_pb2.Instance, images: Iterable[str], volumes: Iterable[str], field: str) -> None:
    """What the instance names is in the section: its image, its volumes."""
    if inst.image and inst.image not in set(images):
        raise DiskRuleError(f"{field}.image", f"{inst.image!r} is not an image of the section's images")
    listed = set(volumes)
    for j, a in enumerate(inst.volumes):
        if a.volume not in listed:
            raise DiskRuleError(
                f"{field}.volumes[{j}].volume", f"{a.volume!r} is not a volume of the section's volumes"
            )


def check_section_disks(s: spec_pb2.InstancesSection) -> None:
    """The section's images and volumes, each alone and unique, and every instance's references to them."""
    if len(s.images) > MAX_IMAGES:
        raise DiskRuleError("images", f"holds {len(s.images)} images, more than {MAX_IMAGES}")
    if len(s.volumes) > MAX_SECTION_VOLUMES:
        raise DiskRuleError("volumes", f"holds {len(s.volumes)} volumes, more than {MAX_SECTION_VOLUMES}")
    names: set[str] = set()
    for i, img in enumerate(s.images):
        check_image(img, f"images[{i}]")
        if img.name in names:
            raise DiskRuleError(f"images[{i}].name", f"{img.name!r} appears twice")
        names.add(img.name)
    ids: set[str] = set()
    serials: set[str] = set()
    for i, vol in enumerate(s.volumes):
        check_volume(vol, f"volumes[{i}]")
        if vol.id in ids:
            raise DiskRuleError(f"volumes[{i}].id", f"{vol.id!r} appears twice")
        if vol.serial in serials:
            raise DiskRuleError(f"volumes[{i}].serial", f"{vol.serial!r} is another volume's serial")
        ids.add(vol.id)
        serials.add(vol.serial)
    for i, inst in enumerate(s.instances):
        check_refs(inst, names, ids, f"instances[{i}]")
