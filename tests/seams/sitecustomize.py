"""Faults the tests install in a build's processes from outside the code: this folder is put on PYTHONPATH of
a build (and so of its worker processes), and these variables say what to do:

- TPU_SHARDS_TEST_KILL=module:function[:N]  SIGKILL at the Nth call (default 1) of that function, counted over
  every process of the build (in TPU_SHARDS_TEST_COUNTER, a file); in a local worker process the build that
  started it is killed too.
- TPU_SHARDS_TEST_SEGV=source-id  a decoder crash (SIGSEGV) when that file is encoded.
- TPU_SHARDS_TEST_OOM=source-id:N  the system's kill (SIGKILL) of the local worker process encoding that file, at
  its first N encodings over every worker of the build (counted in TPU_SHARDS_TEST_COUNTER).
- TPU_SHARDS_TEST_RLIMIT_AS=BYTES  local worker processes start with that address-space limit (a memory limit
  of their own: allocations beyond it fail as they would on a machine that small).
- TPU_SHARDS_TEST_HOLD=module:function=PATH  at the first call, create PATH.reached and wait (up to 120 s)
  until PATH exists: a test holds a build mid-way, acts, then lets it go.
- TPU_SHARDS_TEST_HOSTNAME=NAME  the build's processes say they run on host NAME: as a Dataflow job's workers
  are other machines than the next build's, which cannot see whether the holder of a lock is still alive.

The functions are wrapped right after their module is imported, so every caller gets the wrapper."""
from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import os
import signal
import sys
import time

_WRAPS: dict[str, list] = {}


def _calls() -> int:
    """This call's number among every process's calls (one byte appended per call to the counter file).

    The offset after an O_APPEND write is where this very write ended: the file's size may already include a
    byte another process appended since, and two calls at once would both read 2."""
    fd = os.open(os.environ["TPU_SHARDS_TEST_COUNTER"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, b".")
        return os.lseek(fd, 0, os.SEEK_CUR)
    finally:
        os.close(fd)


def _kill(n: int):
    def wrap(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if _calls() == n:
                if os.environ.get("TPU_SHARDS_POOL_WORKER"):
                    os.kill(os.getppid(), signal.SIGKILL)
                os.kill(os.getpid(), signal.SIGKILL)
            return fn(*args, **kwargs)
        return wrapper
    return wrap


def _segv(source_id: str):
    def wrap(fn):
        @functools.wraps(fn)
        def wrapper(item, *args, **kwargs):
            if item.source_id == source_id:
                os.kill(os.getpid(), signal.SIGSEGV)
            return fn(item, *args, **kwargs)
        return wrapper
    return wrap


def _oom(spec: str):
    source_id, _, times = spec.rpartition(":")

    def wrap(fn):
        @functools.wraps(fn)
        def wrapper(item, *args, **kwargs):
            if item.source_id == source_id and os.environ.get("TPU_SHARDS_POOL_WORKER") and _calls() <= int(times):
                os.kill(os.getpid(), signal.SIGKILL)
            return fn(item, *args, **kwargs)
        return wrapper
    return wrap


def _hold(path: str):
    state = {"held": False}

    def wrap(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if not state["held"]:
                state["held"] = True
                open(path + ".reached", "w").close()
                deadline = time.monotonic() + 120
                while not os.path.exists(path) and time.monotonic() < deadline:
                    time.sleep(0.05)
            return fn(*args, **kwargs)
        return wrapper
    return wrap


def _target(text: str) -> tuple[str, str]:
    module, _, function = text.partition(":")
    return module, function


if os.environ.get("TPU_SHARDS_TEST_KILL"):
    spec, _, nth = os.environ["TPU_SHARDS_TEST_KILL"].rpartition(":") if os.environ["TPU_SHARDS_TEST_KILL"].count(
        ":") > 1 else (os.environ["TPU_SHARDS_TEST_KILL"], "", "1")
    module, function = _target(spec)
    _WRAPS.setdefault(module, []).append((function, _kill(int(nth))))
if os.environ.get("TPU_SHARDS_TEST_SEGV"):
    _WRAPS.setdefault("shard_utils.media.encode", []).append(("encode_data", _segv(os.environ["TPU_SHARDS_TEST_SEGV"])))
if os.environ.get("TPU_SHARDS_TEST_OOM"):
    _WRAPS.setdefault("shard_utils.media.encode", []).append(("encode_data", _oom(os.environ["TPU_SHARDS_TEST_OOM"])))
if os.environ.get("TPU_SHARDS_TEST_RLIMIT_AS") and os.environ.get("TPU_SHARDS_POOL_WORKER"):
    import resource

    _limit = int(os.environ["TPU_SHARDS_TEST_RLIMIT_AS"])
    resource.setrlimit(resource.RLIMIT_AS, (_limit, _limit))
if os.environ.get("TPU_SHARDS_TEST_HOSTNAME"):
    import socket

    socket.gethostname = lambda: os.environ["TPU_SHARDS_TEST_HOSTNAME"]
if os.environ.get("TPU_SHARDS_TEST_HOLD"):
    where, _, path = os.environ["TPU_SHARDS_TEST_HOLD"].partition("=")
    module, function = _target(where)
    _WRAPS.setdefault(module, []).append((function, _hold(path)))


class _Patching(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in _WRAPS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            for function, wrap in _WRAPS[name]:
                setattr(module, function, wrap(getattr(module, function)))

        spec.loader.exec_module = exec_module
        return spec


if _WRAPS:
    sys.meta_path.insert(0, _Patching())
