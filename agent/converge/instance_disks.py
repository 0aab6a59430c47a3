"""The disk side of an `instances` pass: tenant images, root overlays and persistent volumes.

The converger (agent.converge.instances) calls it at a few points of its pass:

1. `begin`: the section's volumes are created and grown (agent.instances.volumes) before any instance is
   defined, and which volume each running or paused domain has open is read from the listing (read-only
   when the spec attaches it so to that instance, else as a writer: the safe side).
2. `config`: an instance's root disk (`instances/<id>/disk.qcow2` when it names an image) and its volumes;
   a volume the store could not create or grow fails the instances that attach it, with why.
3. Before a define, `image_waiting`: the image is downloaded in the background (agent.instances.images);
   until it is there the instance is not defined or started (waiting, the section PROGRESSING), and a bad
   one (a digest mismatch, a refused header) fails it. After the define, `prepare_root`: the base is
   verified again, the overlay made, checked and grown (agent.instances.overlay).
4. Before a start, `claim`: one writer per volume, the first in spec order keeps it (the pass starts in spec
   order); a stop or delete `release`s what the domain had open.
5. After the starts, `live`: a running or paused domain whose spec attaches other volumes now is changed
   through the runtime (QMP `blockdev-add` + `device_add`, `device_del` + `blockdev-del` on qemu).
6. `end`: a volume the section no longer lists and no domain has open is destroyed, and the store's space
   is kept for the status report (`storage`, StatusReport.volume_storage). A cached image that neither the
   section lists nor any instance's disk was made from is removed (`ImageStore.prune`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from agent.instances.images import FAILED, WAITING, ImageError, ImageStore
from agent.instances.overlay import Base, Overlays
from agent.instances.runtime import PAUSED, RUNNING, Domain, InstanceRuntime, RuntimeFailure, VolumeConfig
from agent.instances.volume_rules import OpenVolumes
from agent.instances.volumes import VolumeStore
from agent.offload import Offload
from bc.protocol import disk_rules
from bc.protocol.pb import common_pb2, spec_pb2
from bc.seams.clock import Clock

log = logging.getLogger(__name__)

REASON_IMAGE_PENDING = "ImagePending"


def instance_disks(
    data_dir: Path, offload: Offload, clock: Clock, ca_pem: bytes, wake: Callable[[], None]
) -> InstanceDisks:
    """A node's: `<data-dir>/images`, the overlays in qemu's `<data-dir>/instances`, `<data-dir>/volumes`; a
    download that ends wakes the converge loop."""
    return InstanceDisks(
        ImageStore(data_dir / "images", offload, clock, ca_pem=ca_pem, on_change=wake),
        Overlays(data_dir / "instances", offload),
        VolumeStore(data_dir / "volumes", offload),
    )


class InstanceDisks:
    def __init__(self, images: ImageStore, overlays: Overlays, volumes: VolumeStore) -> None:
        self.images = images
        self.overlays = overlays
        self.volumes = volumes
        self.open = OpenVolumes()
        self.storage: common_pb2.VolumeStorage | None = None
        self._section = spec_pb2.InstancesSection()
        self._problems: dict[str, str] = {}

    def _image(self, inst: spec_pb2.Instance) -> spec_pb2.TenantImage | None:
        for img in self._section.images:
            if img.name == inst.image:
                return img
        return None

    def _volume(self, volume_id: str) -> spec_pb2.Volume | None:
        for v in self._section.volumes:
            if v.id == volume_id:
                return v
        return None

    async def begin(self, section: spec_pb2.InstancesSection, domains: list[Domain]) -> None:
        self._section = section
        self._problems = await self.volumes.sync(list(section.volumes))
        read_only = {(i.id, a.volume) for i in section.instances for a in i.volumes if a.read_only}
        self.open = OpenVolumes()
        for d in domains:
            if d.managed and d.state in (RUNNING, PAUSED):
                for v in d.volumes:
                    self.open.open(d.id, v, (d.id, v) in read_only)

    def config(self, inst: spec_pb2.Instance) -> tuple[tuple[Path, Path] | None, tuple[VolumeConfig, ...]]:
        """((the root disk's path, its base image's), or None; the volumes), or RuntimeFailure: the instance
        names what the section does not hold. A volume the store refused does not stop this (a running VM is
        never stopped for it): its start or live attach is refused (`claim`, `live`)."""
        disk: tuple[Path, Path] | None = None
        if inst.image:
            img = self._image(inst)
            if img is None:
                raise RuntimeFailure(f"its image {inst.image!r} is not one of the section's images")
            disk = (self.overlays.disk(inst.id), self.images.path(img))
        out: list[VolumeConfig] = []
        for a in inst.volumes:
            vol = self._volume(a.volume)
            if vol is None:
                raise RuntimeFailure(f"volume {a.volume} is not one of the section's volumes")
            out.append(VolumeConfig(vol.id, self.volumes.path(vol.id), vol.serial, a.read_only))
        return disk, tuple(out)

    async def image_waiting(self, inst: spec_pb2.Instance) -> str:
        """'' when the instance's image (if any) is here; else the waiting message. RuntimeFailure when the
        image is bad."""
        img = self._image(inst)
        if not inst.image or img is None:
            return ""
        try:  # a node never trusts that the server checked
            disk_rules.check_image(img, f"image {img.name}:")
        except disk_rules.DiskRuleError as e:
            raise RuntimeFailure(f"the spec's {e}") from None
        st = await self.images.want(img)
        if st.state == FAILED:
            raise RuntimeFailure(st.message)
        return f"{REASON_IMAGE_PENDING}: {st.message}" if st.state == WAITING else ""

    async def prepare_root(self, inst: spec_pb2.Instance) -> None:
        img = self._image(inst)
        if img is None:
            return
        try:
            size = await self.images.verify(img)
        except ImageError as e:
            raise RuntimeFailure(str(e)) from None
        base = Base(self.images.path(img), img.format, img.sha256, size)
        await self.overlays.prepare(inst.id, base, inst.disk_size_bytes)

    def claim(self, inst: spec_pb2.Instance) -> str:
        """'' and the instance's volumes taken as open; else why it may not open them (nothing taken)."""
        for a in inst.volumes:
            why = self._problems.get(a.volume) or self.open.refusal(inst.id, a.volume, a.read_only)
            if why:
                return why
        for a in inst.volumes:
            self.open.open(inst.id, a.volume, a.read_only)
        return ""

    def release(self, instance_id: str) -> None:
        self.open.close(instance_id)

    async def forget(self, instance_id: str) -> None:
        self.open.close(instance_id)
        await self.overlays.forget(instance_id)

    async def live(self, inst: spec_pb2.Instance, runtime: InstanceRuntime) -> str:
        """Bring a running or paused domain's volumes to the spec's; '' or the first failure (one clause)."""
        want = {a.volume: a for a in inst.volumes}
        have = self.open.of(inst.id)
        for vid in have:  # a volume this pass grew: resized live in the guests that have it open
            if vid in want and vid in self.volumes.grown:
                try:
                    await runtime.resize_volume(inst.id, vid, self.volumes.grown[vid])
                except RuntimeFailure as e:
                    return f"resize: {e}"
        for vid in have:
            if vid not in want:
                try:
                    await runtime.detach_volume(inst.id, vid)
                except RuntimeFailure as e:
                    return f"detach: {e}"
                self.open.close(inst.id, vid)
        _, configs = self.config(inst)
        for v in configs:
            if v.id in have:
                continue
            why = self._problems.get(v.id) or self.open.refusal(inst.id, v.id, v.read_only)
            if why:
                return f"attach: {why}"
            try:
                await runtime.attach_volume(inst.id, v)
            except RuntimeFailure as e:
                return f"attach: {e}"
            self.open.open(inst.id, v.id, v.read_only)
        return ""

    async def end(self) -> None:
        listed = {v.id for v in self._section.volumes}
        await self.volumes.destroy_unlisted(listed, self.open.ids())
        bases = await self.overlays.bases()
        if bases is not None:
            try:
                await self.images.prune(bases | {img.sha256 for img in self._section.images})
            except OSError as e:
                log.warning("event=image.prune-failed error=%r", e.strerror)
        try:
            self.storage = await self.volumes.storage()
        except OSError as e:
            log.warning("event=volume.storage-unreadable error=%r", e.strerror)
            self.storage = None

    def image_sha256(self, inst: spec_pb2.Instance) -> str:
        img = self._image(inst)
        return img.sha256 if img is not None else ""
