"""Protobuf wire-format inspection: which fields did the server actually send?

Parsed messages hide fields the client's schema does not know (they land in "unknown
fields"). A server could smuggle data that way, so the suite walks the raw wire bytes against
the v1 descriptors and reports every field number the schema does not declare, at any depth.
"""

from __future__ import annotations

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

_VARINT, _FIXED64, _LENGTH_DELIMITED, _START_GROUP, _END_GROUP, _FIXED32 = range(6)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def undeclared_fields(data: bytes, descriptor: Descriptor, path: str = "") -> list[str]:
    """Paths of fields in `data` that `descriptor` (recursively) does not declare.

    Returns e.g. ["privacy.#42 (wire type 2, 17 bytes)"]; an unparsable buffer is reported
    as one problem too.
    """
    problems: list[str] = []
    pos = 0
    prefix = f"{path}." if path else ""
    try:
        while pos < len(data):
            key, pos = _read_varint(data, pos)
            number, wire_type = key >> 3, key & 7
            field = descriptor.fields_by_number.get(number)
            value = b""
            if wire_type == _VARINT:
                _, pos = _read_varint(data, pos)
            elif wire_type == _FIXED64:
                pos += 8
            elif wire_type == _FIXED32:
                pos += 4
            elif wire_type == _LENGTH_DELIMITED:
                length, pos = _read_varint(data, pos)
                value = data[pos:pos + length]
                pos += length
            else:
                problems.append(f"{prefix}#{number}: unsupported wire type {wire_type}")
                break
            if pos > len(data):
                raise ValueError("field runs past the end of the message")
            if field is None:
                problems.append(f"{prefix}#{number} (wire type {wire_type}, {len(value)} bytes): not in {descriptor.full_name}")
            elif wire_type == _LENGTH_DELIMITED and field.type == FieldDescriptor.TYPE_MESSAGE:
                problems += undeclared_fields(value, field.message_type, f"{prefix}{field.name}")
    except ValueError as error:
        problems.append(f"{prefix}<unparsable: {error}>")
    return problems


def set_field_paths(message: Message, path: str = "") -> set[str]:
    """Dotted names of every field set in `message`, nested messages included
    (e.g. {"heldout_size", "privacy", "privacy.noise_std"})."""
    paths: set[str] = set()
    for field, value in message.ListFields():
        name = f"{path}.{field.name}" if path else field.name
        paths.add(name)
        if field.type == FieldDescriptor.TYPE_MESSAGE and not field.message_type.GetOptions().map_entry:
            children = value if field.is_repeated else [value]
            for child in children:
                paths |= set_field_paths(child, name)
    return paths
