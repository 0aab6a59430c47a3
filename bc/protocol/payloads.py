"""A command's payload, parsed and checked the same way wherever it is read.

The control plane parses an operator's JSON into the kind's request message before it stores a command
(`bc.control.commands.queue`), and `bc approve sign` and the TUI parse a batch's payload the same way to recompute
the digest its leaves must carry (`bc.pki.batch_scope`): one parser, so the digest the signer computes is the
one the server stored. Pure: no store, no wire.
"""

from __future__ import annotations

import json

from google.protobuf import any_pb2, json_format, struct_pb2
from google.protobuf.message import Message

from bc.errors import UsageError
from bc.protocol import limits
from bc.protocol.pb import kinds_pb2, site_kinds_pb2

REQUEST_MESSAGES: dict[str, type[Message]] = {
    "inventory.refresh": kinds_pb2.InventoryRefreshRequest,
    "diag.nvml": kinds_pb2.DiagNvmlRequest,
    "gpu.reset": kinds_pb2.GpuResetRequest,
    "node.reboot": kinds_pb2.NodeRebootRequest,
    "logs.collect": kinds_pb2.LogsCollectRequest,
    "diag.dcgm": kinds_pb2.DiagDcgmRequest,
    "daemon.upgrade": kinds_pb2.DaemonUpgradeRequest,
    "instance.snapshot": kinds_pb2.InstanceSnapshotRequest,
    # the site agent's kinds (docs/metal.md)
    "bmc.query": site_kinds_pb2.BmcQueryRequest,
    "bmc.power": site_kinds_pb2.BmcPowerRequest,
    "bmc.boot": site_kinds_pb2.BmcBootRequest,
    "bmc.firmware": site_kinds_pb2.BmcFirmwareRequest,
    "bmc.storage": site_kinds_pb2.BmcStorageRequest,
    "bmc.rotate": site_kinds_pb2.BmcRotateRequest,
    "boot.prepareRamdisk": site_kinds_pb2.BootPrepareRamdiskRequest,
    "boot.cleanUp": site_kinds_pb2.BootCleanUpRequest,
    "site.httpProxy": site_kinds_pb2.SiteHttpProxyRequest,
    # the ramdisk role's (docs/metal-ramdisk.md)
    "disk.wipe": kinds_pb2.DiskWipeRequest,
    "deploy.image": kinds_pb2.DeployImageRequest,
    "boot.kexec": kinds_pb2.BootKexecRequest,
}
"""Each kind's request message; every other kind takes a `google.protobuf.Struct`."""


def _first_line(text: str) -> str:
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    return lines[0] if lines else "invalid"


def payload_from_json(kind: str, text: str) -> any_pb2.Any:
    """The kind's request message parsed from protobuf JSON (empty text: `{}`), packed in an `Any`.

    Bad JSON, a non-object or an unknown field is a UsageError of one line
    (protobuf's parse errors run to several).
    """
    text = text.strip() or "{}"
    # Before parsing: a payload over the limit is refused as such, whatever it holds.
    limits.check_size(f"the {kind} payload", limits.text_size(text), "max_payload_bytes")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"the {kind} payload is not valid JSON: {e}") from None
    except RecursionError:
        raise UsageError(f"the {kind} payload nests too deeply") from None
    if not isinstance(doc, dict):
        raise UsageError(f"the {kind} payload must be a JSON object, not {type(doc).__name__}")
    msg = REQUEST_MESSAGES.get(kind, struct_pb2.Struct)()
    try:
        json_format.Parse(text, msg)
    except json_format.ParseError as e:
        raise UsageError(f"the {kind} payload is not a valid {msg.DESCRIPTOR.name}: {_first_line(str(e))}") from None
    except RecursionError:
        raise UsageError(f"the {kind} payload nests too deeply") from None
    out = any_pb2.Any()
    out.Pack(msg, deterministic=True)
    check_payload_size(kind, out)
    return out


def check_payload_size(kind: str, payload: any_pb2.Any) -> None:
    """A UsageError naming `max_payload_bytes` when the encoded payload is over it (see `bc.protocol.limits`)."""
    limits.check_size(f"the {kind} payload", payload.ByteSize(), "max_payload_bytes")


def payload_for(kind: str, payload: any_pb2.Any) -> any_pb2.Any:
    """Check a library caller's payload against the kind; an empty `Any` becomes the kind's empty request."""
    check_payload_size(kind, payload)
    want = REQUEST_MESSAGES.get(kind)
    if not payload.type_url:
        out = any_pb2.Any()
        out.Pack(want() if want else struct_pb2.Struct(), deterministic=True)
        return out
    if want is not None and payload.TypeName() != want.DESCRIPTOR.full_name:
        raise UsageError(f"the {kind} payload must be a {want.DESCRIPTOR.full_name}, not {payload.TypeName()}")
    return payload
