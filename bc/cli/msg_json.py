"""Protobuf messages as the JSON values `--json` prints, without protobuf's `json_format`.

`json_format` and what it pulls in (the message descriptors' options, so
`descriptor_pb2`) cost a one-shot CLI call more than rendering a reply does.
This walk gives byte for byte what `json_format.MessageToDict(msg,
preserving_proto_field_name=True, always_print_fields_with_no_presence=True)`
gave once reordered by field number with 64-bit integers unquoted (the rules
in `bc.cli.render`'s docstring); tests/unit/cli/test_msg_json.py holds that
older form and compares the two on every message type of our protos.

A field with presence (a message, a proto3 `optional`, a oneof member) is
printed only when set, every other field always. Well-known types
(`google.protobuf.*`) keep their own JSON shapes: those, which none of our
replies carry today, still go through `json_format`.
"""

from __future__ import annotations

import binascii
import math
from collections.abc import Mapping
from typing import Any, cast

from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message

_BY_NUMBER: dict[str, list[FieldDescriptor]] = {}


def message_to_json(msg: Message) -> dict[str, Any]:
    """`msg` as a JSON object: proto field names, fields in number order, 64-bit integers as numbers."""
    return cast(dict[str, Any], _message(msg))


def _message(msg: Message) -> Any:
    desc = cast(Descriptor, msg.DESCRIPTOR)
    if desc.full_name.startswith("google.protobuf."):
        return _well_known(msg)  # a Timestamp is a string, a Struct an object, …
    out: dict[str, Any] = {}
    for field in _fields(desc):
        if field.has_presence and not msg.HasField(field.name):
            continue
        value = getattr(msg, field.name)
        if isinstance(value, Mapping):  # a map field's container, whichever protobuf backend runs
            value_field = cast(Descriptor, field.message_type).fields_by_name["value"]
            out[field.name] = {_map_key(k): _value(value_field, value[k]) for k in value}
        elif field.is_repeated:
            out[field.name] = [_value(field, v) for v in value]
        else:
            out[field.name] = _value(field, value)
    return out


def _fields(desc: Descriptor) -> list[FieldDescriptor]:
    fields = _BY_NUMBER.get(desc.full_name)
    if fields is None:
        fields = _BY_NUMBER[desc.full_name] = sorted(desc.fields, key=lambda f: f.number)
    return fields


def _map_key(key: object) -> str:
    if isinstance(key, bool):
        return "true" if key else "false"
    return str(key)


def _value(field: FieldDescriptor, value: Any) -> Any:
    cpp = field.cpp_type
    if cpp == FieldDescriptor.CPPTYPE_MESSAGE:
        return _message(value)
    if cpp == FieldDescriptor.CPPTYPE_ENUM:
        return _enum(field, value)
    if cpp == FieldDescriptor.CPPTYPE_STRING:
        if field.type == FieldDescriptor.TYPE_BYTES:
            return binascii.b2a_base64(value, newline=False).decode("ascii")  # as base64.b64encode
        return str(value)
    if cpp == FieldDescriptor.CPPTYPE_BOOL:
        return bool(value)
    if cpp in (FieldDescriptor.CPPTYPE_DOUBLE, FieldDescriptor.CPPTYPE_FLOAT):
        return _float(field, value)
    return value  # integers of every width: a JSON number (json_format's quoted int64, unquoted)


def _enum(field: FieldDescriptor, number: int) -> Any:
    enum = cast(EnumDescriptor, field.enum_type)
    known = enum.values_by_number.get(number)
    if known is not None:
        return known.name
    if enum.is_closed:
        raise ValueError(f"{field.full_name} holds {number}, not a value of the closed enum {enum.full_name}")
    return number  # an open (proto3) enum keeps a number it does not know, as json_format does


def _float(field: FieldDescriptor, value: float) -> Any:
    if math.isinf(value):
        return "-Infinity" if value < 0 else "Infinity"
    if math.isnan(value):
        return "NaN"
    if field.cpp_type == FieldDescriptor.CPPTYPE_FLOAT:
        from google.protobuf.internal import type_checkers  # no float field today: loaded if one appears

        return type_checkers.ToShortestFloat(value)
    return value


def _well_known(msg: Message) -> Any:
    from google.protobuf import json_format

    return json_format.MessageToDict(msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)


__all__ = ["message_to_json"]
