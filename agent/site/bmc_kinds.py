"""The `bmc.*` kinds: one Redfish conversation each with a machine of the site's section.

Every kind names the machine by its name in the section; the BMC URL and credentials are the site's own
(`SiteState.bmc`), never a command's. Each holds the lock `bmc:<machine>`, so two commands never drive one
BMC at once, and each talks to the BMC off the loop under the site's timeouts (`agent.site.redfish.call`).
A BMC that fails is the command's outcome, with its reason: `bmc-unreachable`, `bmc-timeout`,
`bmc-auth-failed`, `bmc-error`, `bmc-unsupported`; a section without the machine is `unknown-machine`, a
credentials file that is not 0600 (or missing) `bmc-credentials`.

Flags (bc.protocol.kinds): all destructive but `bmc.query`; `bmc.rotate` attested (the dispatcher signs the
result with the node key). `bmc.rotate` makes the new password here (the site's `Secrets`); the credentials
file holds it (as the machine's `pending` entry) before the BMC is asked to take it, and it becomes the
current one after (agent.site.credentials); the result carries the account, never the password. With
`credentials_secret_ref` it fails `bmc-credentials` before touching the BMC (writing back through the broker
is not built).
"""

from __future__ import annotations

import base64
import contextlib
import logging
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from google.protobuf.message import Message

from agent.kinds.base import InvalidPayload, KindContext, KindResult, TypedExecutor
from agent.site import credentials
from agent.site.redfish import BOOT_DEVICES, POWER_ACTIONS, Bmc, BmcFailure, call
from agent.site.state import SiteState, UnknownMachine
from bc.protocol import site_rules
from bc.protocol.pb import site_kinds_pb2 as pb

log = logging.getLogger(__name__)

UNKNOWN_MACHINE = "unknown-machine"
BMC_CREDENTIALS = "bmc-credentials"
STORAGE_ACTIONS = ("list", "create-volume", "delete-volume")


def check_machine(name: str) -> None:
    if not site_rules.MACHINE_NAME.fullmatch(name):
        raise InvalidPayload(f"machine {name!r} is not a machine name")


def check_http_url(field: str, url: str) -> None:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise InvalidPayload(f"{field} is not a URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidPayload(f"{field} must be an http or https URL with a host")


class BmcKind(TypedExecutor[Any]):
    """The shared half: the machine's lock, its BMC opened, the Redfish call, failures as results."""

    def __init__(self, site: SiteState) -> None:
        self.site = site

    def validate(self, request: Any) -> None:
        check_machine(request.machine)

    def locks(self, request: Any) -> list[str]:
        return [f"bmc:{request.machine}"]

    async def execute(self, ctx: KindContext, request: Any) -> KindResult:
        try:
            machine = self.site.machine(request.machine)
        except UnknownMachine as e:
            return KindResult.failure(UNKNOWN_MACHINE, str(e))
        try:
            bmc = await self.site.bmc(machine)
        except credentials.CredentialsError as e:
            return KindResult.failure(BMC_CREDENTIALS, str(e))
        except BmcFailure as e:
            return KindResult.failure(e.reason, e.message)
        try:
            return await self.drive(bmc, machine.name, request)
        except BmcFailure as e:
            log.warning("event=bmc.failed kind=%s machine=%s reason=%s", self.name, machine.name, e.reason)
            return KindResult.failure(e.reason, e.message, {"machine": machine.name})
        finally:
            await self.site.offload(bmc.close)

    async def drive(self, bmc: Bmc, machine: str, request: Any) -> KindResult:
        raise NotImplementedError

    async def _call(self, fn: Any) -> dict[str, Any]:
        result: dict[str, Any] = await call(self.site.offload, self.site.options.timeouts, fn)
        return result


class BmcQuery(BmcKind):
    """Result: `machine`, `power_state`, `health`, `inventory`, `boot` (target, enabled, mode, order)."""

    name = "bmc.query"
    request_type = pb.BmcQueryRequest

    async def drive(self, bmc: Bmc, machine: str, request: Message) -> KindResult:
        out = await self._call(bmc.query)
        return KindResult.success({"machine": machine, **out}, f"{machine}: power {out.get('power_state')}")


class BmcPower(BmcKind):
    name = "bmc.power"
    request_type = pb.BmcPowerRequest

    def validate(self, request: pb.BmcPowerRequest) -> None:
        check_machine(request.machine)
        if request.action not in POWER_ACTIONS:
            raise InvalidPayload(f"action must be one of {', '.join(POWER_ACTIONS)}, not {request.action!r}")

    async def drive(self, bmc: Bmc, machine: str, request: pb.BmcPowerRequest) -> KindResult:
        out = await self._call(lambda: bmc.power(request.action))
        return KindResult.success({"machine": machine, **out}, f"{machine}: {request.action} sent")


class BmcBoot(BmcKind):
    name = "bmc.boot"
    request_type = pb.BmcBootRequest

    def validate(self, request: pb.BmcBootRequest) -> None:
        check_machine(request.machine)
        if request.device and request.device not in BOOT_DEVICES:
            raise InvalidPayload(f"device must be one of {', '.join(BOOT_DEVICES)}, not {request.device!r}")
        if request.virtual_media_url:
            check_http_url("virtual_media_url", request.virtual_media_url)
        if not (request.device or request.virtual_media_url or request.eject_media):
            raise InvalidPayload("name a device, a virtual_media_url or eject_media")

    async def drive(self, bmc: Bmc, machine: str, request: pb.BmcBootRequest) -> KindResult:
        out = await self._call(
            lambda: bmc.boot(request.device, request.persistent, request.virtual_media_url, request.eject_media)
        )
        return KindResult.success({"machine": machine, **out}, f"{machine}: boot set")


class BmcFirmware(BmcKind):
    name = "bmc.firmware"
    request_type = pb.BmcFirmwareRequest

    def validate(self, request: pb.BmcFirmwareRequest) -> None:
        check_machine(request.machine)
        check_http_url("image_url", request.image_url)
        for t in request.targets:
            if not t.startswith("/redfish/v1/"):
                raise InvalidPayload(f"target {t!r} is not a Redfish path (/redfish/v1/…)")

    async def drive(self, bmc: Bmc, machine: str, request: pb.BmcFirmwareRequest) -> KindResult:
        out = await self._call(lambda: bmc.firmware(request.image_url, list(request.targets)))
        return KindResult.success({"machine": machine, **out}, f"{machine}: update started")


class BmcStorage(BmcKind):
    name = "bmc.storage"
    request_type = pb.BmcStorageRequest

    def validate(self, request: pb.BmcStorageRequest) -> None:
        check_machine(request.machine)
        if request.action not in STORAGE_ACTIONS:
            raise InvalidPayload(f"action must be one of {', '.join(STORAGE_ACTIONS)}, not {request.action!r}")
        ids = [("storage_id", request.storage_id)] if request.action != "list" else []
        if request.action == "create-volume":
            if request.capacity_bytes <= 0:
                raise InvalidPayload("capacity_bytes must be above 0")
            ids.append(("volume_name", request.volume_name))
        if request.action == "delete-volume":
            ids.append(("volume_id", request.volume_id))
        for field, value in ids:
            if not site_rules.SYSTEM_ID.fullmatch(value):
                raise InvalidPayload(f"{field} {value!r} is not a Redfish id")

    async def drive(self, bmc: Bmc, machine: str, request: pb.BmcStorageRequest) -> KindResult:
        args = {
            "storage_id": request.storage_id,
            "volume_name": request.volume_name,
            "capacity_bytes": request.capacity_bytes,
            "volume_type": request.volume_type,
            "volume_id": request.volume_id,
        }
        out = await self._call(lambda: bmc.storage(request.action, args))
        return KindResult.success({"machine": machine, "action": request.action, **out}, f"{machine}: {request.action}")


class BmcRotate(BmcKind):
    name = "bmc.rotate"
    request_type = pb.BmcRotateRequest

    def validate(self, request: pb.BmcRotateRequest) -> None:
        check_machine(request.machine)
        if request.username and not site_rules.MACHINE_NAME.fullmatch(request.username):
            raise InvalidPayload(f"username {request.username!r} is not an account name")

    async def drive(self, bmc: Bmc, machine: str, request: pb.BmcRotateRequest) -> KindResult:
        if self.site.section.credentials_secret_ref:  # writing back through the broker is not built
            return KindResult.failure(
                BMC_CREDENTIALS,
                f"bmc.rotate cannot write to credentials_secret_ref {self.site.section.credentials_secret_ref!r}"
                " (not built): set the new password on the BMC, then `bc secret set`; the BMC was not touched",
            )
        path = Path(self.site.section.credentials_file)
        current = await self.site.offload(credentials.load, path, machine)
        username = request.username or current.username
        password = base64.urlsafe_b64encode(self.site.secrets.token_bytes(24)).decode().rstrip("=")
        try:  # on disk before the BMC has it: no failure after this point loses access
            await self.site.offload(credentials.stage, path, machine, current, username, password)
        except (OSError, credentials.CredentialsError) as e:
            return KindResult.failure(BMC_CREDENTIALS, f"{path} could not be written ({e}): the BMC was not touched")
        try:
            out = await self._call(lambda: bmc.rotate(username, password))
        except BmcFailure:
            with contextlib.suppress(OSError, credentials.CredentialsError):
                await self.site.offload(credentials.unstage, path, machine)
            raise
        try:
            await self.site.offload(credentials.commit, path, machine)
        except (OSError, credentials.CredentialsError) as e:
            log.error("event=bmc.rotate.uncommitted machine=%s file=%s error=%r", machine, path, str(e))
            return KindResult.failure(
                BMC_CREDENTIALS,
                f"the BMC of {machine} took the new password, which is {machine}'s pending entry in {path};"
                f" it could not be made the current one ({e})",
                {"machine": machine, "username": username},
            )
        log.info("event=bmc.rotated machine=%s username=%s", machine, username)
        return KindResult.success({"machine": machine, "rotated": True, **out}, f"{machine}: {username} rotated")


def bmc_executors(site: SiteState) -> list[BmcKind]:
    return [BmcQuery(site), BmcPower(site), BmcBoot(site), BmcFirmware(site), BmcStorage(site), BmcRotate(site)]
