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
A graph for a remote runner or a template keeps Beam's own ways (stock Beam on its workers reads bz2), even one made
in another thread while a block is open: the switch holds in the block's thread, and in the runner's threads only
while they run an instruction of a worker the block made."""
from __future__ import annotations

import concurrent.futures
import contextlib
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

from apache_beam.internal import cloudpickle_pickler
from apache_beam.runners.worker import bundle_processor, sdk_worker, statesampler

__all__ = ["in_process_run"]

_BZ2_START = b"Qlpo"  # base64 of "BZh", how every bz2 stream starts
_lock = threading.Lock()
_here = threading.local()  # .within: how many blocks (or instructions of a worker made in one) this thread is in


def _within() -> bool:
    return getattr(_here, "within", 0) > 0


@contextlib.contextmanager
def _held() -> Iterator[None]:
    _here.within = getattr(_here, "within", 0) + 1
    try:
        yield
    finally:
        _here.within -= 1


def _zlib_while_within(dumps: Callable[..., bytes]) -> Callable[..., bytes]:
    def dumps_zlib_within(o: Any, *args: Any, use_zlib: bool = False, **kwargs: Any) -> bytes:
        return dumps(o, *args, use_zlib=use_zlib or _within(), **kwargs)

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
        if not _within():
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
    return (_InCallingThread if _within() else concurrent.futures.ThreadPoolExecutor)(*args, **kwargs)


def _marked_if_within(init: Callable[..., None]) -> Callable[..., None]:
    """A worker's bundle processor cache says whether it was made within a block: Beam's runner makes its workers
    in the thread that runs the graph, in every mode, before it hands them bundles in other threads."""
    def init_marked(cache: Any, *args: Any, **kwargs: Any) -> None:
        init(cache, *args, **kwargs)
        cache.made_within = _within()

    init_marked.beams = init  # type: ignore[attr-defined]
    return init_marked


def _within_for_workers_made_within(do_instruction: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """The runner hands its bundles to its own threads in some modes (several workers, Beam's multi-threading
    mode): a worker whose bundle processors were made within a block runs each instruction within it too."""
    def do_instruction_within(worker: Any, request: Any) -> Any:
        if not getattr(worker.bundle_processor_cache, "made_within", False):
            return do_instruction(worker, request)
        with _held():
            return do_instruction(worker, request)

    do_instruction_within.beams = do_instruction  # type: ignore[attr-defined]
    return do_instruction_within


def _install() -> None:
    """Wrap Beam's functions once; outside a block each wrapper does what Beam does."""
    if not hasattr(cloudpickle_pickler.loads, "beams"):
        cloudpickle_pickler.loads = _either(cloudpickle_pickler.loads)
        cloudpickle_pickler.dumps = _zlib_while_within(cloudpickle_pickler.dumps)
        sampler = statesampler.StateSampler
        sampler.start = _unsampled_while_within(sampler.start)  # type: ignore[method-assign,assignment]
        sampler.stop = _stop_either(sampler.stop)  # type: ignore[method-assign,assignment]
        cache = sdk_worker.BundleProcessorCache
        cache.__init__ = _marked_if_within(cache.__init__)  # type: ignore[method-assign]
        worker, do_instruction = sdk_worker.SdkWorker, _within_for_workers_made_within
        worker.do_instruction = do_instruction(worker.do_instruction)  # type: ignore[method-assign,assignment]
        futures = types.SimpleNamespace(**vars(concurrent.futures))
        futures.ThreadPoolExecutor = _executor_while_within
        bundle_processor.concurrent = types.SimpleNamespace(futures=futures)  # type: ignore[assignment]


@contextlib.contextmanager
def in_process_run() -> Iterator[None]:
    """Within the block, in this thread and in the runner's threads working for it, Beam's pickles are zlib, its
    stages unsampled and made in the calling thread; other threads keep Beam's own ways. From the first block on
    Beam reads bz2 and zlib alike (a pickle made within may be read after it, or in another thread)."""
    with _lock:
        _install()
    with _held():
        yield
