"""Beam's pickles of the graph compressed with zlib instead of bz2 while a graph is made and run in this process:
Beam compresses each of the graph's functions about 400 times in a small build and decompresses about 700, and
bz2 at level 9 sets up megabytes of tables each time (about a seventh of the driver's CPU after its imports).
Beam reads either (its coders' pickles are zlib already); a graph for a remote runner or a template keeps bz2,
which is what stock Beam on its workers reads."""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from apache_beam.internal import cloudpickle_pickler

__all__ = ["zlib_pickles"]

_BZ2_START = b"Qlpo"  # base64 of "BZh", how every bz2 stream starts
_lock = threading.Lock()
_within = [0]  # zlib_pickles blocks open now


def _zlib_while_within(dumps: Callable[..., bytes]) -> Callable[..., bytes]:
    def dumps_zlib_within(o: Any, *args: Any, use_zlib: bool = False, **kwargs: Any) -> bytes:
        return dumps(o, *args, use_zlib=use_zlib or _within[0] > 0, **kwargs)

    dumps_zlib_within.beams = dumps  # type: ignore[attr-defined]  # Beam's own, kept on the wrapper
    return dumps_zlib_within


def _either(loads: Callable[..., Any]) -> Callable[..., Any]:
    def loads_either(encoded: bytes | str, *args: Any, use_zlib: bool = False, **kwargs: Any) -> Any:
        start = encoded[:4]
        bz2 = (start.encode("ascii", "replace") if isinstance(start, str) else bytes(start)) == _BZ2_START
        return loads(encoded, *args, use_zlib=use_zlib or not bz2, **kwargs)

    loads_either.beams = loads  # type: ignore[attr-defined]
    return loads_either


@contextlib.contextmanager
def zlib_pickles() -> Iterator[None]:
    """Within the block, Beam's pickles are zlib; from the first block on, Beam reads bz2 and zlib alike (a
    pickle made within may be read after it)."""
    with _lock:
        if not hasattr(cloudpickle_pickler.loads, "beams"):
            cloudpickle_pickler.loads = _either(cloudpickle_pickler.loads)
        if not hasattr(cloudpickle_pickler.dumps, "beams"):
            cloudpickle_pickler.dumps = _zlib_while_within(cloudpickle_pickler.dumps)
        _within[0] += 1
    try:
        yield
    finally:
        with _lock:
            _within[0] -= 1
