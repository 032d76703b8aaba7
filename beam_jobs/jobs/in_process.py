"""Beam's in-process runner without the costs that only a remote worker needs, while a graph is made and run in
this process. A small build runs about 50 stages, and for each Beam
- compresses the pickles of the graph's functions with bz2 at level 9, which sets up megabytes of tables each time
  (about 400 compressions and 700 decompressions in a 64-image build): here zlib, which Beam reads too (its
  coders' pickles are zlib already);
- starts a thread that samples the time spent in each step and waits for it to wake up at the stage's end (up to
  a tenth of the stage): here no sampling thread (the step times it feeds are read by no one; counters and the
  current step are kept as before);
- makes the stage's operations in a thread of their own, so that a remote worker whose unpickling hangs can give
  up after an hour: here in the calling thread.
A graph for a remote runner or a template keeps Beam's own ways (stock Beam on its workers reads bz2)."""
from __future__ import annotations

import concurrent.futures
import contextlib
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

from apache_beam.internal import cloudpickle_pickler
from apache_beam.runners.worker import bundle_processor, statesampler

__all__ = ["in_process_run"]

_BZ2_START = b"Qlpo"  # base64 of "BZh", how every bz2 stream starts
_lock = threading.Lock()
_within = [0]  # in_process_run blocks open now


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


def _unsampled_while_within(start: Callable[[Any], None]) -> Callable[[Any], None]:
    def start_unsampled_within(sampler: Any) -> None:
        if not _within[0]:
            sampler.unsampled = False
            return start(sampler)
        sampler.tracked_thread = threading.current_thread()  # what Beam's start does, less the sampling thread
        statesampler.set_current_tracker(sampler)
        sampler.started = sampler.unsampled = True

    start_unsampled_within.beams = start  # type: ignore[attr-defined]
    return start_unsampled_within


def _stop_either(stop: Callable[[Any], None]) -> Callable[[Any], None]:
    def stop_either(sampler: Any) -> None:
        if not getattr(sampler, "unsampled", False):
            return stop(sampler)
        statesampler.set_current_tracker(None)
        sampler.finished = True

    stop_either.beams = stop  # type: ignore[attr-defined]
    return stop_either


class _InCallingThread:
    """An executor that runs each task in the calling thread (what BundleProcessor asks of concurrent.futures)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __enter__(self) -> _InCallingThread:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - handed over as a thread's future would
            future.set_exception(exc)
        return future


def _executor_while_within(*args: Any, **kwargs: Any) -> Any:
    return (_InCallingThread if _within[0] else concurrent.futures.ThreadPoolExecutor)(*args, **kwargs)


def _install() -> None:
    """Wrap Beam's functions once; outside a block each wrapper does what Beam does."""
    if not hasattr(cloudpickle_pickler.loads, "beams"):
        cloudpickle_pickler.loads = _either(cloudpickle_pickler.loads)
        cloudpickle_pickler.dumps = _zlib_while_within(cloudpickle_pickler.dumps)
        sampler = statesampler.StateSampler
        sampler.start = _unsampled_while_within(sampler.start)  # type: ignore[method-assign,assignment]
        sampler.stop = _stop_either(sampler.stop)  # type: ignore[method-assign,assignment]
        futures = types.SimpleNamespace(**vars(concurrent.futures))
        futures.ThreadPoolExecutor = _executor_while_within
        bundle_processor.concurrent = types.SimpleNamespace(futures=futures)  # type: ignore[assignment]


@contextlib.contextmanager
def in_process_run() -> Iterator[None]:
    """Within the block, Beam's pickles are zlib, its stages unsampled and made in the calling thread; from the
    first block on Beam reads bz2 and zlib alike (a pickle made within may be read after it)."""
    with _lock:
        _install()
        _within[0] += 1
    try:
        yield
    finally:
        with _lock:
            _within[0] -= 1
