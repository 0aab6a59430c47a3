"""Canonical JSON and spec hashing.

A NodeSpec is stored as protobuf JSON with sorted keys and no insignificant
whitespace; two specs are the same desired state exactly when their canonical
JSON is byte-equal, which is what lets the generation rise only on a real
change. Field names are the proto names (snake_case); default values are
omitted, so an empty section and an absent one are the same spec.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message

from bc.errors import UsageError
from bc.protocol.pb import spec_pb2
from bc.protocol.sections import SECTIONS as SECTIONS  # re-exported: most callers name it from here


class SpecError(UsageError):
    """A spec or section that does not parse: the operator's input, so nothing is stored."""


def _first_line(e: Exception) -> str:
    """protobuf's parse errors append a multi-line list of fields; the first line says what is wrong."""
    return str(e).strip().splitlines()[0].strip() if str(e).strip() else type(e).__name__


def canonical_json(value: Any) -> str:
    """Sorted keys, compact separators, UTF-8 kept as is."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def message_to_dict(msg: Message) -> dict[str, Any]:
    return json_format.MessageToDict(msg, preserving_proto_field_name=True)


def spec_to_canonical(spec: spec_pb2.NodeSpec) -> str:
    """An empty section and an absent one are the same desired state, so empty ones are dropped."""
    doc = message_to_dict(spec)
    return canonical_json({k: v for k, v in doc.items() if v != {}})


def spec_from_json(text: str) -> spec_pb2.NodeSpec:
    spec = spec_pb2.NodeSpec()
    try:
        json_format.Parse(text or "{}", spec)
    except (json_format.ParseError, ValueError) as e:
        raise SpecError(f"the spec does not parse: {_first_line(e)}") from None
    except RecursionError:
        raise SpecError("the spec does not parse: it nests too deeply") from None
    return spec


def section_from_json(section: str, text: str) -> Message:
    """Parse one section's protobuf JSON; raises SpecError with one clear sentence."""
    if section not in SECTIONS:
        raise SpecError(f"unknown spec section {section!r}; sections are {', '.join(SECTIONS)}")
    msg: Message = getattr(spec_pb2.NodeSpec(), section).__class__()
    try:
        json_format.Parse(text, msg)
    except (json_format.ParseError, ValueError) as e:
        raise SpecError(f"the {section} section does not parse: {_first_line(e)}") from None
    except RecursionError:
        raise SpecError(f"the {section} section does not parse: it nests too deeply") from None
    return msg


def spec_hash(canonical: str) -> str:
    """`sha256:<hex>` of the canonical JSON."""
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def section_is_empty(spec: spec_pb2.NodeSpec, section: str) -> bool:
    return not spec.HasField(section) or getattr(spec, section).ByteSize() == 0
