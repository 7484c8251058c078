"""Messages of the job's side services: a JSON header, then the raw bytes of any arrays it lists.

Arrays are plain numbers (float and integer dtypes only), rebuilt with numpy from their bytes: a
peer can send nothing that executes code when read, unlike a pickle.
"""

from __future__ import annotations

import json
import math
import socket
import struct
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

_LENGTH = struct.Struct("!I")
MAX_HEADER_BYTES = 1 << 20
ALLOWED_DTYPES = frozenset({"float16", "float32", "float64", "int32", "int64"})


class ByteStream(Protocol):
    """A buffered binary reader (a socket's makefile("rb"), a request handler's rfile)."""

    def read(self, size: int = -1, /) -> bytes: ...

    def readline(self, size: int = -1, /) -> bytes: ...


class WireError(ConnectionError):
    """A malformed or truncated message."""


def encode(header: Mapping[str, Any], arrays: Mapping[str, np.ndarray] | None = None) -> bytes:
    arrays = arrays or {}
    meta = [{"name": name, "dtype": a.dtype.name, "shape": list(a.shape)} for name, a in arrays.items()]
    for item in meta:
        if item["dtype"] not in ALLOWED_DTYPES:
            raise ValueError(f"array {item['name']!r}: dtype {item['dtype']} cannot be sent")
    head = json.dumps({**header, "arrays": meta}).encode()
    body = b"".join(np.ascontiguousarray(a).tobytes() for a in arrays.values())
    return _LENGTH.pack(len(head)) + head + body


def send(
    sock: socket.socket, header: Mapping[str, Any], arrays: Mapping[str, np.ndarray] | None = None
) -> None:
    sock.sendall(encode(header, arrays))


def _read_exactly(stream: ByteStream, count: int) -> bytes:
    data = stream.read(count)
    if data is None or len(data) < count:
        raise WireError("connection closed in the middle of a message")
    return data


def receive(stream: ByteStream) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """One message: its header (without the array list) and its arrays by name."""
    first = stream.read(_LENGTH.size)
    if not first:
        raise WireError("connection closed")
    if len(first) < _LENGTH.size:
        raise WireError("connection closed in the middle of a message")
    (length,) = _LENGTH.unpack(first)
    if length > MAX_HEADER_BYTES:
        raise WireError(f"message header of {length} bytes exceeds {MAX_HEADER_BYTES}")
    try:
        header = json.loads(_read_exactly(stream, length))
        meta = header.pop("arrays")
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, AttributeError) as error:
        raise WireError(f"malformed message header: {error}") from None
    arrays: dict[str, np.ndarray] = {}
    for item in meta:
        dtype = str(item.get("dtype"))
        shape = [int(x) for x in item.get("shape", [])]
        if dtype not in ALLOWED_DTYPES or any(x < 0 for x in shape):
            raise WireError(f"array {item.get('name')!r}: dtype {dtype} or shape {shape} not allowed")
        size = math.prod(shape) * np.dtype(dtype).itemsize
        data = _read_exactly(stream, size)
        arrays[str(item["name"])] = np.frombuffer(data, dtype=dtype).reshape(shape).copy()
    return header, arrays
