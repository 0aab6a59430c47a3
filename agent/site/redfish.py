"""The one seam to a BMC: Redfish through sushy, blocking calls run off the loop under a deadline.

Why sushy (docs/metal.md, "The Redfish client"): it is OpenStack Ironic's Redfish library, maintained and
released with Ironic, tested against the BMCs Ironic drives (Dell, HPE, Lenovo, Supermicro, the DMTF's
emulator) and against sushy-tools, which is also what our tests run. It is blocking (requests), so every
call here runs through the agent's `Offload` (a worker thread) inside `asyncio.timeout`, and sushy itself
gets a connect and a read timeout, no server-side retries, so a thread left behind by a timed-out BMC ends
within `read_timeout_s` too. sushy has no AccountService resource: `rotate` PATCHes the account through the
same connector (same session, TLS and timeouts).

`Bmc` is the protocol the kinds call (`RedfishBmc` in production and tests against the emulator); its
methods block. `call()` is how the kinds reach it: it maps every failure to one of the reasons below.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import requests
import sushy
from sushy import exceptions as sx
from sushy.connector import Connector

from agent.offload import Offload
from agent.site.credentials import Credential

log = logging.getLogger(__name__)

BMC_UNREACHABLE = "bmc-unreachable"
BMC_TIMEOUT = "bmc-timeout"
BMC_AUTH = "bmc-auth-failed"
BMC_ERROR = "bmc-error"
BMC_UNSUPPORTED = "bmc-unsupported"

POWER_ACTIONS: dict[str, str] = {"on": "On", "off": "ForceOff", "cycle": "PowerCycle", "reset": "ForceRestart"}
BOOT_DEVICES: dict[str, str] = {"pxe": "Pxe", "disk": "Hdd", "cd": "Cd", "bios": "BiosSetup", "none": "None"}

T = TypeVar("T")


class BmcFailure(Exception):
    """A BMC call that did not do what was asked: `reason` is the command's error code."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason, self.message = reason, message


@dataclass(frozen=True)
class Timeouts:
    connect_s: float = 5.0
    read_s: float = 20.0
    call_s: float = 60.0
    """The ceiling on one kind's whole conversation with a BMC, on the loop."""


class Bmc(Protocol):
    def query(self) -> dict[str, Any]: ...
    def power(self, action: str) -> dict[str, Any]: ...
    def boot(self, device: str, persistent: bool, media_url: str, eject: bool) -> dict[str, Any]: ...
    def firmware(self, image_url: str, targets: list[str]) -> dict[str, Any]: ...
    def storage(self, action: str, args: dict[str, Any]) -> dict[str, Any]: ...
    def rotate(self, username: str, new_password: str) -> dict[str, Any]: ...
    def close(self) -> None: ...


OpenBmc = Callable[[str, str, Credential], Bmc]
"""(bmc_url, system_id, credential) -> a Bmc; the site's state holds one (tests pass the real one too)."""


def _enum(v: Any) -> Any:
    return getattr(v, "value", v)


class RedfishBmc:
    """One BMC over sushy; `system_id` empty: the BMC's only system."""

    def __init__(self, bmc_url: str, system_id: str, credential: Credential, timeouts: Timeouts) -> None:
        self.url = bmc_url.rstrip("/")
        self.system_id = system_id
        self._conn = Connector(
            self.url,
            verify=True,
            server_side_retries=1,
            server_side_retries_delay=0.1,
            default_request_timeout=timeouts.read_s,
            connect_timeout=timeouts.connect_s,
        )
        self._root = sushy.Sushy(
            self.url,
            auth=sushy.auth.BasicAuth(credential.username, credential.password),
            connector=self._conn,
            server_side_retries=1,
            server_side_retries_delay=0.1,
            read_timeout=timeouts.read_s,
            connect_timeout=timeouts.connect_s,
        )

    def _system(self) -> Any:
        if self.system_id:
            return self._root.get_system(f"/redfish/v1/Systems/{self.system_id}")
        return self._root.get_system()

    def query(self) -> dict[str, Any]:
        s = self._system()
        status = s.status
        boot = s.boot
        out: dict[str, Any] = {
            "system_id": s.identity,
            "power_state": _enum(s.power_state),
            "health": {
                "state": _enum(getattr(status, "state", None)),
                "health": _enum(getattr(status, "health", None)),
                "health_rollup": _enum(getattr(status, "health_rollup", None)),
            },
            "inventory": {
                "manufacturer": s.manufacturer,
                "model": s.model,
                "serial_number": s.serial_number,
                "sku": s.sku,
                "bios_version": s.bios_version,
                "uuid": s.uuid,
            },
            "boot": {
                "target": _enum(getattr(boot, "target", None)),
                "enabled": _enum(getattr(boot, "enabled", None)),
                "mode": _enum(getattr(boot, "mode", None)),
                "order": list(getattr(boot, "boot_order", None) or []),
            },
        }
        try:
            summary = s.processors.summary
            out["inventory"]["processors"] = {"count": summary.count, "architecture": _enum(summary.architecture)}
        except (sx.SushyError, AttributeError):
            pass
        try:
            out["inventory"]["nics"] = sorted(
                str(n.mac_address).lower() for n in s.ethernet_interfaces.get_members() if n.mac_address
            )
        except (sx.SushyError, AttributeError):
            pass
        mem = getattr(s, "memory_summary", None)
        if mem is not None and getattr(mem, "size_gib", None) is not None:
            out["inventory"]["memory_gib"] = mem.size_gib
        return out

    def power(self, action: str) -> dict[str, Any]:
        s = self._system()
        before = _enum(s.power_state)
        s.reset_system(sushy.ResetType(POWER_ACTIONS[action]))
        return {"action": action, "reset_type": POWER_ACTIONS[action], "power_state_before": before}

    def boot(self, device: str, persistent: bool, media_url: str, eject: bool) -> dict[str, Any]:
        s = self._system()
        out: dict[str, Any] = {}
        if eject or media_url:
            media = self._cd(s)
            if eject and media.inserted:
                media.eject_media()
                out["ejected"] = True
            if media_url:
                media.insert_media(media_url, inserted=True, write_protected=True)
                out["inserted"] = media_url
        if device:
            enabled = sushy.BootSourceOverrideEnabled.CONTINUOUS if persistent else sushy.BootSourceOverrideEnabled.ONCE
            s.set_system_boot_options(target=sushy.BootSource(BOOT_DEVICES[device]), enabled=enabled)
            s.refresh()
            out["boot"] = {"target": _enum(s.boot.target), "enabled": _enum(s.boot.enabled)}
        return out

    def _cd(self, system: Any) -> Any:
        """The virtual CD: the system's VirtualMedia, else its manager's."""
        collections = []
        try:
            collections.append(system.virtual_media)
        except (sx.SushyError, AttributeError):
            pass
        collections.extend(m.virtual_media for m in self._root.get_manager_collection().get_members())
        for coll in collections:
            try:
                members = coll.get_members()
            except sx.SushyError:
                continue
            for media in members:
                types = {str(_enum(t)) for t in (media.media_types or [])}
                if types & {"CD", "DVD"}:
                    return media
        raise BmcFailure(BMC_UNSUPPORTED, "the BMC has no virtual CD")

    def firmware(self, image_url: str, targets: list[str]) -> dict[str, Any]:
        if not targets:
            targets = [self._system().path]
        svc = self._root.get_update_service()
        monitor = svc.simple_update(image_url, targets=targets)
        return {"image_url": image_url, "targets": targets, "task": getattr(monitor, "task_monitor_uri", "") or ""}

    def storage(self, action: str, args: dict[str, Any]) -> dict[str, Any]:
        s = self._system()
        if action == "list":
            controllers = []
            for st in s.storage.get_members():
                drives = [
                    {"id": d.identity, "name": d.name, "capacity_bytes": d.capacity_bytes, "media": _enum(d.media_type)}
                    for d in st.drives
                ]
                volumes = [
                    {"id": v.identity, "name": v.name, "capacity_bytes": v.capacity_bytes, "type": _enum(v.volume_type)}
                    for v in st.volumes.get_members()
                ]
                controllers.append({"id": st.identity, "drives": drives, "volumes": volumes})
            return {"storage": controllers}
        st = s.storage.get_member(f"{s.storage.path.rstrip('/')}/{args['storage_id']}")
        if action == "create-volume":
            payload = {"Name": args["volume_name"], "CapacityBytes": args["capacity_bytes"]}
            if args.get("volume_type"):
                payload["VolumeType"] = args["volume_type"]
            vol = st.volumes.create(payload)
            return {"created": getattr(vol, "identity", None) or getattr(vol, "path", "")}
        vol = st.volumes.get_member(f"{st.volumes.path.rstrip('/')}/{args['volume_id']}")
        vol.delete()
        return {"deleted": args["volume_id"]}

    def rotate(self, username: str, new_password: str) -> dict[str, Any]:
        accounts = self._conn.get("/redfish/v1/AccountService/Accounts").json()
        for member in accounts.get("Members", []):
            path = member.get("@odata.id", "")
            doc = self._conn.get(path).json()
            if doc.get("UserName") == username:
                self._conn.patch(path, data={"Password": new_password})
                return {"username": username, "account": path}
        raise BmcFailure(BMC_ERROR, f"the BMC has no account {username!r}")

    def close(self) -> None:
        self._conn.close()


def open_redfish(timeouts: Timeouts) -> OpenBmc:
    def open_bmc(bmc_url: str, system_id: str, credential: Credential) -> Bmc:
        return RedfishBmc(bmc_url, system_id, credential, timeouts)

    return open_bmc


def _innermost(e: BaseException) -> str:
    """The deepest cause's words (requests wraps urllib3 wraps the socket error)."""
    while e.__cause__ is not None or e.__context__ is not None:
        e = e.__cause__ or e.__context__  # type: ignore[assignment]
    return f"{type(e).__name__}: {e}"


def _failure(e: Exception) -> BmcFailure:
    if isinstance(e, BmcFailure):
        return e
    if isinstance(e, sx.AccessError):
        return BmcFailure(BMC_AUTH, f"the BMC refused the credentials ({e.status_code})")
    if isinstance(e, sx.HTTPError):
        return BmcFailure(BMC_ERROR, f"the BMC answered {e.status_code}: {e.detail or e.message}"[:300])
    if isinstance(e, sx.ConnectionError):
        cause = e.__cause__ or e.__context__
        detail = str(e.kwargs.get("error", "")) if hasattr(e, "kwargs") else ""
        if isinstance(cause, requests.Timeout) or "timed out" in detail.lower() or "timeout" in detail.lower():
            return BmcFailure(BMC_TIMEOUT, "the BMC did not answer in time")
        return BmcFailure(BMC_UNREACHABLE, f"the BMC cannot be reached ({_innermost(cause or e)})"[:300])
    if isinstance(e, (sx.MissingAttributeError, sx.MissingActionError, sx.MalformedAttributeError)):
        return BmcFailure(BMC_UNSUPPORTED, f"the BMC lacks what this needs: {e}"[:300])
    if isinstance(e, sx.SushyError):
        return BmcFailure(BMC_ERROR, str(e)[:300])
    if isinstance(e, (requests.RequestException, ValueError)):
        return BmcFailure(BMC_ERROR, f"{type(e).__name__}: {e}"[:300])
    raise e


async def call(offload: Offload, timeouts: Timeouts, fn: Callable[[], T]) -> T:
    """`fn()` off the loop under `timeouts.call_s`; every failure a BmcFailure with the command's reason."""

    def guarded() -> T:
        try:
            return fn()
        except Exception as e:
            raise _failure(e) from None

    try:
        async with asyncio.timeout(timeouts.call_s):
            return await offload(guarded)
    except TimeoutError:
        raise BmcFailure(BMC_TIMEOUT, f"the BMC did not answer within {timeouts.call_s:g} s") from None
