"""Which secrets a NodeSpec names, and where: the rule both the broker's binding check and the agent use.

A spec names a secret by reference, never by value:

* `telemetry.headers_secret_ref`: the OTLP exporter's headers (docs/telemetry.md);
* the `kubernetes` host unit's `token_secret_ref`: its `kubeadm join` bootstrap token (docs/host.md);
* `site.credentials_secret_ref`: the site's BMC credentials, the credentials file's JSON (docs/metal.md);
* an instance's `user_data_secret_ref`: the guest's user data (docs/instances.md), bound to the section.

A reference is a secret name (`check_name`). `refs(spec)` lists every (section, unit, name) the spec names;
the broker answers a request only when its binding's section (and unit) names the secret it asks for.
`allocation_names` is what an allocation binding may ask for: the secrets its instances name.
Designed for but not built yet: a job step's secrets.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from bc.errors import UsageError
from bc.protocol.pb import spec_pb2

NAME_RE = re.compile(r"[a-z0-9]([a-z0-9._-]{0,126}[a-z0-9])?")
"""A secret's name: 1-128 lower-case letters, digits, '.', '_' or '-', starting and ending alphanumeric."""


def check_name(name: str) -> str:
    """The name, or UsageError with the rule: 1-128 lower-case letters, digits, '.', '_' or '-'."""
    if not NAME_RE.fullmatch(name):
        raise UsageError(
            f"bad secret name {name!r}: 1-128 lower-case letters, digits, '.', '_' or '-', starting and ending"
            " with a letter or digit"
        )
    return name


UNIT_REFS: dict[str, str] = {"kubernetes": "token_secret_ref"}
"""Host units whose settings may name a secret, and the setting that does."""


@dataclass(frozen=True, order=True)
class SecretRef:
    section: str
    unit: str  # a host unit's name; "" for a section-level reference
    name: str

    @property
    def where(self) -> str:
        return f"{self.section}/{self.unit}" if self.unit else self.section


def refs(spec: spec_pb2.NodeSpec) -> list[SecretRef]:
    """Every secret the spec names, in order."""
    out: list[SecretRef] = []
    if spec.HasField("telemetry") and spec.telemetry.headers_secret_ref:
        out.append(SecretRef("telemetry", "", spec.telemetry.headers_secret_ref))
    if spec.HasField("site") and spec.site.credentials_secret_ref:
        out.append(SecretRef("site", "", spec.site.credentials_secret_ref))
    if spec.HasField("instances"):
        for name in {i.user_data_secret_ref for i in spec.instances.instances if i.user_data_secret_ref}:
            out.append(SecretRef("instances", "", name))
    for unit in spec.host.units if spec.HasField("host") else ():
        if unit.name not in UNIT_REFS:
            continue
        try:
            settings = json.loads(unit.settings_json or "{}")
        except ValueError:
            continue  # bad settings name nothing (the node fails the unit as UnitInvalid)
        ref = settings.get(UNIT_REFS[unit.name]) if isinstance(settings, dict) else None
        if isinstance(ref, str) and ref:
            out.append(SecretRef("host", unit.name, ref))
    return sorted(out)


def allocation_names(spec: spec_pb2.NodeSpec, section: str, allocation_id: str) -> set[str]:
    """The secrets the instances of one allocation name (an allocation binding's check); none outside
    the instances section."""
    if section != "instances" or not allocation_id or not spec.HasField("instances"):
        return set()
    return {
        i.user_data_secret_ref
        for i in spec.instances.instances
        if i.allocation_id == allocation_id and i.user_data_secret_ref
    }


def names(spec: spec_pb2.NodeSpec, section: str, unit: str = "") -> set[str]:
    """The secrets one section (or host unit) of the spec names."""
    return {r.name for r in refs(spec) if r.section == section and r.unit == unit}
