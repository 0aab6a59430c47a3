"""The host converger: the `host` section's config units, applied idempotently through the HostOps seam.

Each pass:

1. parses every unit of the section: a unit name this agent does not know
   is UNSUPPORTED with its name, bad settings fail the section terminally
   (`UnitInvalid`: nothing of that unit is touched), and each known unit is
   checked against the host (a huge page size, a MIG profile);
2. reads the records of what it applied before
   (`etc/bc/host-units/<unit>.json` under the host root): the record,
   not memory, says what is applied, so a restart changes nothing;
3. removes every unit that left the section (its drop-ins go, its runtime
   effects are undone where that means something), then its record;
4. applies each valid unit whose settings differ from its record, or whose
   effects drifted (a drop-in edited or deleted, a pool or a MIG layout
   changed), in `UNITS` order, and writes its record after it succeeded.
   A unit is applied whole or not at all: a failed effect rolls the unit
   back (agent.converge.host_units.base) and the section stays PROGRESSING,
   retried on the next pass; the other units still converge.

After the pass, each unit that reports a condition (the GPU node units:
`DriverMismatch`, `FabricManagerReady`, `ContainerToolkitReady`,
`KubernetesJoined`) gives its verdict, kept in `verdicts` for the health
monitor: a unit whose apply failed says why, an invalid one `UnitInvalid`,
and a unit that left the spec takes its condition with it. A unit whose
settings hold a secret (`kubernetes`) is recorded by a digest of them.

While the journal holds no spec (generation 0: lost, or a new node) the
pass removes and applies nothing: like the devices converger's adoption
(agent.converge.adoption), the node never undoes what a spec applied on its
own; the section is PROGRESSING `JournalLost` naming the units kept, until a
signed spec decides.

The section's state: PROGRESSING while any unit failed retryably, FAILED
(terminal at this generation) for bad settings, UNSUPPORTED for unknown
unit names (reason `UnitUnsupported`, the names in the message), else
CONVERGED. With `--no-host-units` the agent runs `ExternallyManaged`
instead: a non-empty section is UNSUPPORTED with `HostManagedExternally`
and nothing on the host is touched.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from google.protobuf.message import Message

from agent.converge.adoption import NO_SPEC, REASON_JOURNAL_LOST
from agent.converge.host_ops import HostOps
from agent.converge.host_units import UNITS
from agent.converge.host_units.base import HostContext, Observed, Record, Unit, UnitInvalid, bad, sha256
from agent.converge.run import CONVERGED, FAILED, PROGRESSING, UNSUPPORTED, SectionResult
from agent.converge.secret_port import SecretSource
from agent.health.rules import Verdict
from agent.hw import cdi
from agent.hw.base import HardwareBackend
from bc.protocol.canonical import canonical_json
from bc.protocol.pb import common_pb2, spec_pb2
from bc.protocol.spec_validation import parse_settings

log = logging.getLogger(__name__)

RECORDS_DIR = "etc/bc/host-units"
REASON_INVALID = "UnitInvalid"
REASON_APPLY_FAILED = "UnitApplyFailed"
REASON_UNSUPPORTED = "UnitUnsupported"
REASON_EXTERNAL = "HostManagedExternally"
_RECORD_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")


def record_path(unit: str) -> str:
    return f"{RECORDS_DIR}/{unit}.json"


def settings_text(impl: Unit, settings: Mapping[str, Any]) -> str:
    """What the record keeps of a unit's settings: their canonical JSON, or its digest for a unit whose
    settings hold a secret (`kubernetes`' token: the records are world-readable)."""
    text = canonical_json(settings)
    return "sha256:" + sha256(text.encode()) if getattr(impl, "secret_settings", False) else text


def parse_record(name: str, data: bytes) -> Record:
    doc = json.loads(data)
    if not isinstance(doc, dict) or doc.get("unit") != name:
        raise ValueError(f"the record of {name} names another unit")
    return Record(
        unit=name,
        settings=str(doc.get("settings", "")),
        files={str(k): str(v) for k, v in dict(doc.get("files") or {}).items()},
        undo=dict(doc.get("undo") or {}),
    )


class HostConverger:
    """Converges the `host` section's units on the host under `ops.root`."""

    section: str = "host"

    def __init__(
        self,
        ops: HostOps,
        hw: HardwareBackend,
        *,
        cdi_dir: Path | None = None,
        units: Mapping[str, Unit] = UNITS,
        node_labels: Callable[[], Mapping[str, str]] = dict,
        secrets: SecretSource | None = None,
    ) -> None:
        """`cdi_dir`: where the devices converger keeps holds (a MIG layout never changes under one);
        `node_labels`: the node's bc labels (its held spec body's), for the kubernetes unit's join."""
        self.ops = ops
        self.hw = hw
        self.cdi_dir = cdi_dir
        self.units = units
        self.ctx = HostContext(
            ops=ops,
            hw=hw,
            inventory=self._inventory,
            held_gpus=self._held_gpus,
            cdi_dir=cdi_dir,
            node_labels=node_labels,
            secrets=secrets,
        )
        self.verdicts: list[Verdict] = []
        """The units' conditions after the last pass (agent.health reports them with the node's)."""

    async def _inventory(self) -> common_pb2.Inventory:
        return await self.ops.offload(self.hw.inventory)

    async def _held_gpus(self) -> set[str]:
        if self.cdi_dir is None:
            return set()
        holds = await self.ops.offload(cdi.read_holds, self.cdi_dir)
        return {atom.gpu_uuid for h in holds.values() for atom in h.atoms}

    async def converge(self, desired: Message, generation: int) -> SectionResult:
        if not isinstance(desired, spec_pb2.HostSection):
            raise TypeError(f"the host converger got a {type(desired).__name__}")
        self.ctx.generation = generation  # a unit's secret request is bound to it
        wanted: dict[str, tuple[str, Any]] = {}  # unit name -> (canonical settings, parsed)
        unsupported: list[str] = []
        invalid: list[str] = []
        invalid_by_unit: dict[str, str] = {}
        errors: dict[str, str] = {}
        named: set[str] = set()
        for unit in desired.units:
            named.add(unit.name)
            impl = self.units.get(unit.name)
            if impl is None:
                unsupported.append(unit.name)
                continue
            try:
                try:
                    settings = parse_settings(unit.settings_json)
                except ValueError as e:
                    raise UnitInvalid(f"{unit.name}: settings_json {e}") from None
                parsed = impl.parse(settings)
                await impl.check(parsed, self.ctx)
            except UnitInvalid as e:
                invalid.append(str(e))
                invalid_by_unit[unit.name] = str(e)
                continue
            wanted[unit.name] = (settings_text(impl, settings), parsed)

        records = await self._records()
        if generation == NO_SPEC:
            return self._keep_all(records)
        retry: list[str] = []
        for name, rec in sorted(records.items()):
            if name in named:
                continue  # still in the spec (even when its new settings are bad: the old ones stay applied)
            try:
                impl = self.units.get(name)
                if impl is not None:
                    await impl.remove(rec, self.ctx)
                else:  # a unit an older agent applied: its drop-ins go
                    for rel in sorted(rec.files):
                        await self.ops.remove(rel)
                await self.ops.remove(record_path(name))
                log.info("event=host.unit_removed unit=%s", name)
            except OSError as e:
                retry.append(f"{name}: removing: {e}")
                log.warning("event=host.unit_remove_failed unit=%s error=%r", name, str(e))

        for name, impl in self.units.items():
            if name not in wanted:
                continue
            text, parsed = wanted[name]
            old = records.get(name)
            try:
                if old is not None and old.settings == text and not await impl.drifted(parsed, old, self.ctx):
                    continue
                applied = await impl.apply(parsed, old, self.ctx)
                new = Record(name, text, applied.files, applied.undo)
                await self.ops.write(
                    record_path(name), (json.dumps(new.doc(), indent=2, sort_keys=True) + "\n").encode()
                )
                log.info("event=host.unit_applied unit=%s generation=%d", name, generation)
            except OSError as e:
                retry.append(f"{name}: {e}")
                errors[name] = str(e)
                log.warning("event=host.unit_apply_failed unit=%s error=%r", name, str(e))
        self.verdicts = await self._conditions(wanted, errors, invalid_by_unit)

        if retry:
            return SectionResult(FAILED, REASON_APPLY_FAILED, "; ".join(retry), terminal=False)
        if invalid:
            return SectionResult(FAILED, REASON_INVALID, "; ".join(invalid), terminal=True)
        if unsupported:
            return SectionResult(
                UNSUPPORTED,
                REASON_UNSUPPORTED,
                f"this agent has no host unit {', '.join(repr(n) for n in unsupported)}"
                f" (units are {', '.join(self.units)})",
                terminal=True,
            )
        return SectionResult(CONVERGED)

    async def _conditions(
        self, wanted: Mapping[str, tuple[str, Any]], errors: Mapping[str, str], invalid: Mapping[str, str]
    ) -> list[Verdict]:
        """Each observed unit's verdicts; a unit that left the spec takes its condition with it."""
        out: list[Verdict] = []
        for name, impl in self.units.items():
            if not isinstance(impl, Observed):
                continue
            kind = (impl.condition, impl.good)
            if name in invalid:
                out.append(bad(kind, REASON_INVALID, invalid[name]))
            elif name in wanted:
                try:
                    out += await impl.conditions(wanted[name][1], errors.get(name), self.ctx)
                except OSError as e:
                    out.append(Verdict(impl.condition, "Unknown", "QueryFailed", f"{name}: {e}"))
        return out

    def _keep_all(self, records: Mapping[str, Record]) -> SectionResult:
        """No spec in the journal (lost or new): nothing applied is removed until a signed spec says so."""
        if not records:
            return SectionResult(CONVERGED)
        names = ", ".join(sorted(records))
        return SectionResult(
            PROGRESSING,
            REASON_JOURNAL_LOST,
            f"the journal holds no spec: keeping the host units applied ({names}) until a signed spec says otherwise",
        )

    async def _records(self) -> dict[str, Record]:
        out: dict[str, Record] = {}
        for fname in await self.ops.list_dir(RECORDS_DIR):
            name = fname.removesuffix(".json")
            if not fname.endswith(".json") or not _RECORD_NAME.fullmatch(name):
                continue
            data = await self.ops.read(record_path(name))
            if data is None:
                continue
            try:
                out[name] = parse_record(name, data)
            except (ValueError, TypeError) as e:
                log.warning("event=host.record_unreadable unit=%s error=%r", name, str(e))
        return out


class ExternallyManaged:
    """`--no-host-units`: another tool owns the host's configuration; bc touches nothing of it."""

    section: str = "host"

    async def converge(self, desired: Message, generation: int) -> SectionResult:
        if desired.ByteSize() == 0:
            return SectionResult(CONVERGED)
        return SectionResult(
            UNSUPPORTED,
            REASON_EXTERNAL,
            "this node's host configuration is managed outside bc (bc node --no-host-units)",
            terminal=True,
        )
