"""Fields of a NodeSpec this agent does not know: an older agent meeting a newer spec.

protobuf keeps the fields it cannot name as unknown fields instead of failing
the parse, so an agent would otherwise converge a section while ignoring part
of it and report CONVERGED for what it never enforced. `unknown_paths` lists
every unknown field in a message and the messages inside it, each as the
dotted field-number path from the message (`1.7`: field 7 of the message in
field 1; a repeated field's items share its number). `agent.converge.run`
makes a section with any of them UNSUPPORTED with those numbers, without
running its converger, and reports a NodeSpec field it does not know at all
as a section of its own, `field-<n>`. Pure.
"""

from __future__ import annotations

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.unknown_fields import UnknownFieldSet


def unknown_numbers(msg: Message) -> list[int]:
    """The numbers of the unknown fields directly in `msg`, sorted, each once."""
    fields = UnknownFieldSet(msg)
    return sorted({fields[i].field_number for i in range(len(fields))})


def unknown_paths(msg: Message, prefix: str = "") -> list[str]:
    """Every unknown field in `msg` and below, as dotted field-number paths, sorted and each once."""
    found = {f"{prefix}{n}" for n in unknown_numbers(msg)}
    for fd, value in msg.ListFields():
        if fd.type != FieldDescriptor.TYPE_MESSAGE:
            continue
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            values = [v for v in value.values() if isinstance(v, Message)]
        elif fd.is_repeated:
            values = list(value)
        else:
            values = [value]
        for v in values:
            found.update(unknown_paths(v, f"{prefix}{fd.number}."))
    return sorted(found, key=lambda p: [int(x) for x in p.split(".")])
