"""A pool of worker processes for a local build, one per core: they encode media and write shards.

Beam's in-process runner uses about one core, and its multi-process mode sends every element
over gRPC. The encode and write steps instead hand batches of work to these workers, which write
fragments and shards themselves and send back only what the job must know of them. Workers are plain
`python -m beam_jobs.local_pool [MODULE...]` processes talking over pipes (they import the named modules
as they start, so a build that starts its pool first overlaps their start-up with its own):
they import no Beam, run in their own session (a terminal's Ctrl-C reaches the build, which stops
them), die with their parent, and a worker that crashes on a hostile file costs only that file:
its batch is retried item by item and the item that crashes again is rejected.

A task is `fn(items, *args)` for a function named by module and attribute, returning one result
list per batch; one pool per process serves every step (`LocalPool.shared`). A task may leave work
in its worker's memory (`keeps`: the encoders' fragment buffers): the pool remembers it until the
worker says it is written, and replays it elsewhere if that worker dies first. An exception in a
task is raised again here, with its message; only a dying worker counts as a crash.
"""
from __future__ import annotations

import collections
import importlib
import os
import pickle
import queue
import signal
import struct
import subprocess
import sys
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

_HEADER = struct.Struct("<Q")
POOL_WORKER = "TPU_SHARDS_POOL_WORKER"  # marks a worker process (test hooks kill the build, not just the worker)
MAX_STARTUP_FAILURES = 3


def _send(stream, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)))
    stream.write(data)
    stream.flush()


def _receive(stream) -> Any:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError
    (size,) = _HEADER.unpack(header)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError
    return pickle.loads(data)


@dataclass
class _Task:
    ident: int
    fn: str
    items: list
    args: tuple
    on_crash: Callable[[Any, str], Any] | None  # None: a crash fails the task (nothing to isolate)
    isolated: bool = False  # a single item re-run after its batch crashed a worker
    keeps: bool = False  # fn returns (result, released): its work stays in the worker until released
    pin: int | None = None  # only this worker may run it
    replay: bool = False  # re-run of kept work lost with its worker: fn(..., replay=True) redoes only that
    key: str | None = None  # work started early: its answer waits for `take(key)`, not in `results`


@dataclass
class _Worker:
    proc: subprocess.Popen
    outstanding: collections.deque = field(default_factory=collections.deque)
    answered: bool = False
    held: list = field(default_factory=list)  # kept tasks answered but not yet released


@dataclass(frozen=True)
class _Raised:
    """A task's exception, sent back to be raised again in the pool's process."""

    error: BaseException | None
    text: str


class LocalPool:
    """Runs `fn(items, *args)` for batches of items in `workers` processes; results come back per batch.

    `fn` is named by module and attribute so workers import only what it needs. `on_crash(item, why)`
    gives the result for an item that crashed a worker twice (e.g. a rejection).
    """

    _live: "weakref.WeakSet[LocalPool]" = weakref.WeakSet()
    _shared = threading.local()  # one pool per thread that runs steps (a pool is not shared across threads)

    @classmethod
    def shared(cls, workers: int, preload: tuple[str, ...] = ()) -> "LocalPool":
        """This thread's pool of `workers` processes, started on first use and kept for every step.

        preload: modules a new pool's workers import as they start (see LocalPool)."""
        pool = getattr(cls._shared, "pool", None)
        if pool is None or pool._closed or pool.size != workers:
            if pool is not None:
                pool.close()
            pool = cls._shared.pool = LocalPool(workers, preload=preload)
        return pool

    @classmethod
    def current(cls) -> "LocalPool | None":
        """This thread's pool, if one is running."""
        pool = getattr(cls._shared, "pool", None)
        return None if pool is None or pool._closed else pool

    @classmethod
    def close_all(cls) -> None:
        """Stop every pool of this process (the end of a run)."""
        for pool in list(cls._live):
            pool.close()

    def __init__(self, workers: int, depth: int = 2, preload: tuple[str, ...] = ()):
        if workers < 1:
            raise ValueError("a pool needs at least one worker")
        self.size, self._depth, self._preload = workers, depth, tuple(preload)
        self._events: queue.Queue = queue.Queue()
        self._pending: collections.deque = collections.deque()
        self._ready: collections.deque = collections.deque()  # batches' results met while waiting in `take`
        self._answers: dict[str, Any] = {}  # key: answer of work started early (None: it failed)
        self._workers: dict[int, _Worker] = {}
        self._next_task = 0
        self._next_worker = 0
        self._startup_failures = 0
        self._closed = False
        LocalPool._live.add(self)
        for _ in range(workers):
            self._spawn()

    @classmethod
    def kill_all(cls) -> None:
        """Stop every pool of this process at once (Ctrl-C)."""
        for pool in list(cls._live):
            pool.kill()

    # ------------------------------------------------------------------ public

    def submit(self, fn: str, items: list, *args: Any, on_crash: Callable[[Any, str], Any] | None = None,
               keeps: bool = False) -> None:
        """Queue `fn(items, *args)`; its result list arrives through `results`.

        keeps: fn returns (result, released) and keeps its work in the worker until an answer says
        released; if the worker dies first, fn(items, *args, replay=True) redoes that work elsewhere.
        """
        self._pending.append(_Task(self._new_task_id(), fn, list(items), args, on_crash, keeps=keeps))
        self._dispatch()

    def start(self, key: str, fn: str, *args: Any) -> None:
        """Begin `fn([], *args)` now, ahead of the step that needs it, which collects it with `take(key)`."""
        self._pending.append(_Task(self._new_task_id(), fn, [], args, None, key=key))
        self._answers.pop(key, None)
        self._dispatch()

    def take(self, key: str) -> Any | None:
        """The answer of the work started as `key`, waiting for it; None when none was started or it failed
        (raised, or its worker died): the caller then does the work itself."""
        while self._started(key) and key not in self._answers:
            out = self._handle(self._events.get())
            if out is not None:
                self._ready.append(out)
        return self._answers.pop(key, None)

    def release_all(self, fn: str, *args: Any) -> Iterator[list]:
        """Every remaining batch's results, then `fn([], *args)` on each worker holding kept work, until none does."""
        yield from self.drain()
        while holders := [wid for wid, w in self._workers.items() if w.held]:
            for wid in holders:
                self._pending.append(_Task(self._new_task_id(), fn, [], args, None, keeps=True, pin=wid))
            self._dispatch()
            yield from self.drain()

    @property
    def in_flight(self) -> int:
        """Batches submitted and not yet returned."""
        return len(self._pending) + len(self._ready) + sum(len(w.outstanding) for w in self._workers.values())

    def results(self, block: bool = False) -> Iterator[list]:
        """Finished batches' results: those ready now, or (block) at least one, waiting for it."""
        got_one = False
        while self._ready:
            got_one = True
            yield self._ready.popleft()
        while True:
            try:
                event = self._events.get(block=block and not got_one and self.in_flight > 0)
            except queue.Empty:
                return
            out = self._handle(event)
            if out is not None:
                got_one = True
                yield out

    def drain(self) -> Iterator[list]:
        """Every remaining batch's results, waiting for all of them."""
        while self.in_flight:
            yield from self.results(block=True)

    def close(self) -> None:
        """Stop the workers (they exit when their input closes; stragglers are killed)."""
        if self._closed:
            return
        self._closed = True
        LocalPool._live.discard(self)
        for w in self._workers.values():
            try:
                w.proc.stdin.close()
            except OSError:
                pass
        for w in self._workers.values():
            try:
                w.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()

    def kill(self) -> None:
        """Stop the workers at once (Ctrl-C)."""
        self._closed = True
        LocalPool._live.discard(self)
        for w in self._workers.values():
            if w.proc.poll() is None:
                w.proc.kill()
        for w in self._workers.values():
            try:
                w.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def pids(self) -> list[int]:
        return [w.proc.pid for w in self._workers.values()]

    # ------------------------------------------------------------------ internals

    def _started(self, key: str) -> bool:
        return any(t.key == key for t in self._pending) or any(
            t.key == key for w in self._workers.values() for t in w.outstanding)

    def _new_task_id(self) -> int:
        self._next_task += 1
        return self._next_task

    def _spawn(self) -> None:
        # Their own session: a terminal's Ctrl-C reaches the build, which stops them; not the workers.
        proc = subprocess.Popen([sys.executable, "-m", "beam_jobs.local_pool", *self._preload], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1", POOL_WORKER: "1"},
                                start_new_session=True)
        wid = self._next_worker
        self._next_worker += 1
        self._workers[wid] = _Worker(proc)
        threading.Thread(target=self._read, args=(wid, proc), daemon=True, name=f"local-pool-{wid}").start()

    def _read(self, wid: int, proc: subprocess.Popen) -> None:
        try:
            while True:
                self._events.put(("result", wid, _receive(proc.stdout)))
        except (EOFError, OSError, pickle.UnpicklingError):
            proc.wait()
            self._events.put(("died", wid, proc.returncode))
        except Exception as exc:  # noqa: BLE001 - an answer this process cannot read: fail the build, not hang
            proc.kill()
            self._events.put(("unreadable", wid, f"{type(exc).__name__}: {exc}"))

    def _dispatch(self) -> None:
        for wid, w in sorted(self._workers.items(), key=lambda kv: len(kv[1].outstanding)):
            while len(w.outstanding) < self._depth:
                task = next((t for t in self._pending if t.pin is None or t.pin == wid), None)
                if task is None:
                    break
                self._pending.remove(task)
                kwargs = {"replay": True} if task.replay else {}
                try:
                    _send(w.proc.stdin, (task.ident, task.fn, task.items, task.args, kwargs))
                except (BrokenPipeError, OSError):
                    self._pending.appendleft(task)  # its reader reports the death
                    break
                w.outstanding.append(task)

    def _handle(self, event) -> list | None:
        kind, wid, payload = event
        w = self._workers.get(wid)
        if w is None:
            return None
        if kind == "unreadable":
            raise RuntimeError(f"local pool: cannot read a worker's answer ({payload})")
        if kind == "result":
            ident, result = payload
            task = w.outstanding.popleft()
            if task.ident != ident:
                raise RuntimeError(f"local pool: worker answered task {ident}, expected {task.ident}")
            w.answered = True
            self._startup_failures = 0
            if task.key is not None:
                self._answers[task.key] = None if isinstance(result, _Raised) else result
                self._dispatch()
                return None
            if isinstance(result, _Raised):
                raise result.error if result.error is not None else RuntimeError(result.text)
            if task.keeps:
                result, released = result
                if released:
                    w.held.clear()
                else:
                    w.held.append(task)
            self._dispatch()
            return result
        # The worker died: its first outstanding batch crashed it; the others never started.
        del self._workers[wid]
        if self._closed:
            return None
        if not w.answered:
            self._startup_failures += 1
            if self._startup_failures >= MAX_STARTUP_FAILURES:
                raise RuntimeError(f"local pool: worker processes exit at start-up (exit code {payload}); "
                                   "run with --workers 1 to see why")
        why = _describe_exit(payload)
        out = None
        self._pending = collections.deque(t for t in self._pending if t.pin != wid)  # a release for the dead one
        lost = [_Task(self._new_task_id(), t.fn, t.items, t.args, t.on_crash, t.isolated, True, None, True)
                for t in w.held]  # answered, but their work died with the worker: redo only that
        self._pending.extendleft(reversed(lost))
        tasks = list(w.outstanding)
        for task in tasks:
            if task.key is not None:  # early work lost: its step does it itself
                self._answers[task.key] = None
        if tasks and tasks[0].key is not None:  # early work crashed it: the others never started
            self._pending.extendleft(reversed([t for t in tasks[1:] if t.pin is None and t.key is None]))
            tasks = []
        tasks = [t for t in tasks if t.key is None]
        if tasks:
            crashed, rest = tasks[0], [t for t in tasks[1:] if t.pin is None]
            if crashed.on_crash is None or crashed.replay:
                self._pending.extendleft(reversed(rest))
                self._spawn()
                self._dispatch()
                raise RuntimeError(f"local pool: {why} while running {crashed.fn}")
            if crashed.isolated or len(crashed.items) == 1:
                out = [crashed.on_crash(crashed.items[0], why)]
            else:
                rest = [_Task(self._new_task_id(), crashed.fn, [item], crashed.args, crashed.on_crash, True,
                              crashed.keeps) for item in crashed.items] + rest
            self._pending.extendleft(reversed(rest))
        self._spawn()
        self._dispatch()
        return out


def _describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"the decoder crashed the worker process ({signal.Signals(-code).name})"
        except ValueError:
            return f"the decoder crashed the worker process (signal {-code})"
    return f"the worker process exited with code {code}"


def _die_with_parent() -> None:
    """Ask Linux to kill this worker when its parent dies, so a killed build leaves no orphans."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux: workers still exit when their input pipe closes
        pass


def worker_main(preload: list[str] = ()) -> None:
    """A worker: import the `preload` modules, then answer (task id, function name, items, args) messages
    until the input closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _die_with_parent()
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but results may go to the pipe
    for module in preload:  # while the build is still constructing its graph: start-up in parallel
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001 - the task that needs it imports it again and reports the error
            pass
    functions: dict[str, Callable] = {}
    while True:
        try:
            ident, fn_name, items, args, kwargs = _receive(stdin)
        except EOFError:
            return
        if fn_name not in functions:
            module, _, attr = fn_name.rpartition(".")
            functions[fn_name] = getattr(__import__(module, fromlist=[attr]), attr)
        try:
            result = functions[fn_name](items, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - raised again in the build, with its message
            raised = importlib.import_module("beam_jobs.local_pool")._Raised  # not __main__'s: the build unpickles it
            result = raised(exc if _picklable(exc) else None, f"{type(exc).__name__}: {exc}")
        _send(stdout, (ident, result))
        del items, args, result  # not held while waiting for the next task (a listing begun early is large)


def _picklable(exc: BaseException) -> bool:
    try:
        pickle.loads(pickle.dumps(exc))
        return True
    except Exception:  # noqa: BLE001 - any failure means: send its text instead
        return False


if __name__ == "__main__":
    worker_main(sys.argv[1:])
