"""The few pieces of the Mumble control protocol the mumble adapter needs, encoded by
hand: each message is a 2-byte type, a 4-byte length and a protobuf body
(https://github.com/mumble-voip/mumble/blob/master/src/Mumble.proto). Only varint and
length-delimited fields occur in the messages we read and write."""

from __future__ import annotations

import struct
from typing import Any

VERSION, AUTHENTICATE, PING, REJECT, SERVER_SYNC = 0, 2, 3, 4, 5
CHANNEL_REMOVE, CHANNEL_STATE, USER_REMOVE, USER_STATE, TEXT_MESSAGE = 6, 7, 8, 9, 11
SERVER_CONFIG = 24
READ = {REJECT, SERVER_SYNC, CHANNEL_STATE, USER_REMOVE, USER_STATE, TEXT_MESSAGE, SERVER_CONFIG}
CLIENT_VERSION = (1 << 16) | (3 << 8) | 0  # speaks the 1.3 protocol


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def encode(fields: list[tuple[int, Any]]) -> bytes:
    """Protobuf body from (field number, value) pairs: ints/bools as varints, str/bytes
    length-delimited; repeat a pair for repeated fields."""
    out = bytearray()
    for number, value in fields:
        if isinstance(value, (bool, int)):
            out += varint(number << 3) + varint(int(value))
        else:
            data = value.encode("utf-8") if isinstance(value, str) else bytes(value)
            out += varint(number << 3 | 2) + varint(len(data)) + data
    return bytes(out)


def decode(data: bytes) -> dict[int, list[Any]]:
    """Protobuf body -> {field number: [values]} (varints as int, the rest as bytes)."""
    fields: dict[int, list[Any]] = {}
    pos = 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _read_varint(data, pos)
        elif wire == 2:
            size, pos = _read_varint(data, pos)
            value, pos = data[pos:pos + size], pos + size
        elif wire == 5:
            value, pos = data[pos:pos + 4], pos + 4
        elif wire == 1:
            value, pos = data[pos:pos + 8], pos + 8
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        fields.setdefault(number, []).append(value)
    return fields


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


def frame(kind: int, fields: list[tuple[int, Any]]) -> bytes:
    body = encode(fields)
    return struct.pack(">HI", kind, len(body)) + body


def read_frame(recv_exact) -> tuple[int, dict[int, list[Any]]]:  # type: ignore[no-untyped-def]
    """One message from the stream: (type, fields). `recv_exact(n)` returns n bytes."""
    kind, size = struct.unpack(">HI", recv_exact(6))
    if size > 8 * 1024 * 1024:
        raise ValueError(f"message of {size} bytes is too large")
    body = recv_exact(size)
    # Only the messages the adapter reads are decoded (voice tunnels, stats... are skipped).
    return kind, decode(body) if kind in READ else {}
