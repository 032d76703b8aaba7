"""The messages between a local build and its worker processes: length-prefixed pickles over pipes."""
from __future__ import annotations

import pickle
import struct
from typing import Any

__all__ = ["send", "receive"]

_HEADER = struct.Struct("<Q")


def send(stream, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)))
    stream.write(data)
    stream.flush()


def receive(stream) -> Any:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError
    (size,) = _HEADER.unpack(header)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError
    return pickle.loads(data)
