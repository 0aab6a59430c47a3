"""The root-equivalent table classifies every field the NodeSpec schema knows, and every host unit.

Walking the schema (not a hand-written list of cases) means a field added to
spec.proto, or a host unit added to either end, fails here until someone
decides whether an operator may set it. The rules the table names are then
checked on the classes it describes: every key outside the operator's sysctl
allowlist, every listed key, a core pattern pipe, any unit bc does not know.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import assume, given
from hypothesis import strategies as st

from agent.converge.host_units import UNITS as AGENT_UNITS
from bc.protocol import host_units, root_equiv
from bc.protocol.pb import spec_pb2


def paths(desc: Descriptor, prefix: str) -> Iterator[str]:
    for fd in desc.fields:
        path = f"{prefix}{fd.name}"
        yield path
        if fd.type != FieldDescriptor.TYPE_MESSAGE:
            continue
        if fd.message_type.GetOptions().map_entry:
            for sub in fd.message_type.fields:
                yield f"{path}.{sub.name}"
                if sub.type == FieldDescriptor.TYPE_MESSAGE:
                    yield from paths(sub.message_type, f"{path}.{sub.name}.")
        else:
            yield from paths(fd.message_type, f"{path}.")


def test_every_field_of_every_section_is_classified() -> None:
    schema = set()
    for section in spec_pb2.NodeSpec.DESCRIPTOR.fields:
        schema |= set(paths(section.message_type, f"{section.name}."))
    assert sorted(schema - set(root_equiv.FIELDS)) == [], "fields no one classified"
    assert sorted(set(root_equiv.FIELDS) - schema) == [], "classified fields the schema does not have"
    known = {root_equiv.OPERATOR, root_equiv.ANY_CHANGE, root_equiv.ADDED}
    known |= {root_equiv.ADDED_PRINCIPAL, root_equiv.REMOVED, root_equiv.HOST_UNIT}
    assert set(root_equiv.FIELDS.values()) <= known


def test_every_host_unit_either_end_knows_is_classified() -> None:
    assert set(host_units.PARSERS) <= set(root_equiv.UNITS)
    assert set(AGENT_UNITS) <= set(root_equiv.UNITS)


def host(units: dict[str, object]) -> spec_pb2.HostSection:
    return spec_pb2.HostSection(
        units=[spec_pb2.HostUnit(name=k, settings_json=json.dumps(v)) for k, v in units.items()]
    )


def sysctl_change(key: str, value: str) -> list[str]:
    return root_equiv.changes("host", spec_pb2.HostSection(), host({"sysctl": {key: value}}))


@given(st.sampled_from(root_equiv.SYSCTL_ROOT_KEYS), st.from_regex(r"[a-z0-9_]{0,12}", fullmatch=True))
def test_every_listed_sysctl_key_is_root_equivalent(prefix: str, tail: str) -> None:
    key = prefix + tail if prefix.endswith(".") else prefix
    assert sysctl_change(key + ("x" if key.endswith(".") else ""), "0")


@given(st.from_regex(r"[a-z][a-z0-9_]{0,8}(\.[a-z0-9_]{1,8}){1,3}", fullmatch=True))
def test_a_key_off_the_allowlist_is_root_equivalent(key: str) -> None:
    allowed = any(
        key == p.rstrip(".") or key.startswith(p if p.endswith(".") else p + ".")
        for p in root_equiv.SYSCTL_OPERATOR_PREFIXES
    )
    listed = any(
        key == p.rstrip(".") or key.startswith(p if p.endswith(".") else p + ".") for p in root_equiv.SYSCTL_ROOT_KEYS
    )
    assert bool(sysctl_change(key, "1")) == (listed or not allowed)


@given(st.from_regex(r"[ \t]*\|[ -~]{0,40}", fullmatch=True))
def test_a_core_pattern_pipe_is_root_equivalent_and_a_file_is_not(value: str) -> None:
    assert sysctl_change("kernel.core_pattern", value)
    assert not sysctl_change("kernel.core_pattern", "/var/crash/" + value.replace("|", "_").strip())


@given(st.from_regex(r"[a-z0-9][a-z0-9._-]{0,30}", fullmatch=True))
def test_a_unit_the_table_does_not_know_is_root_equivalent(name: str) -> None:
    assume(name not in root_equiv.UNITS)
    assert root_equiv.changes("host", spec_pb2.HostSection(), host({name: {}}))
