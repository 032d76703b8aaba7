"""A pool of worker processes, one per core, that run functions for the steps of a local build.

Beam's in-process runner runs a stage's elements in one thread. A step that is heavy (encoding a run,
writing a shard) hands each element to this pool instead; the workers import no Beam, run in their own
session (a terminal's Ctrl-C reaches the build, which stops them) and die with their parent.

`submit(fn, *args)` queues fn(*args) and returns a ticket; `results()` gives (ticket, outcome) as tasks end:
`Done(value)`, `Raised(error)` (the task's exception, to raise again in the build) or `Crashed(why)` (the
worker died running it: a decoder that crashes on a hostile file, or the system that killed it for memory).
What a crash means is the caller's decision; the pool starts a new worker and goes on. `submit_alone` runs a
task with no other in flight (a retry after the system killed a worker). Functions are sent by name; the
modules named in `preload` are imported by each worker as it starts, while the build still makes its graph.
"""
from __future__ import annotations

import collections
import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from beam_jobs.local.wire import receive, send

__all__ = [
    "POOL_WORKER", "MAX_STARTUP_FAILURES", "DEPTH", "Done", "Raised", "Crashed", "Outcome", "task_name", "LocalPool",
    "describe_exit"
]

POOL_WORKER = "TPU_SHARDS_POOL_WORKER"  # set in a worker process's environment
MAX_STARTUP_FAILURES = 3
DEPTH = 2  # tasks queued at each worker, so it never waits for the next one


@dataclass(frozen=True)
class Done:
    value: Any


@dataclass(frozen=True)
class Raised:
    error: BaseException


@dataclass(frozen=True)
class Crashed:
    why: str
    killed: bool = False  # SIGKILL: what the system sends when memory runs out, never a decoder's own crash


Outcome = Done | Raised | Crashed


def task_name(fn: Callable) -> str:
    """module:qualname of a module-level function (what a worker imports)."""
    name = f"{fn.__module__}:{fn.__qualname__}"
    if "<" in name or fn.__module__ == "__main__":
        raise ValueError(f"{name} is not a module-level function a worker process can import")
    return name


@dataclass
class _Task:
    ticket: int
    fn: str
    args: tuple
    kwargs: dict
    alone: bool = False


@dataclass
class _Worker:
    proc: subprocess.Popen
    outstanding: collections.deque
    inbox: queue.Queue  # messages for the worker, written to its pipe by its sender thread
    answered: bool = False


class LocalPool:
    """`workers` processes running submitted functions (see the module's docstring)."""

    _live: weakref.WeakSet[LocalPool] = weakref.WeakSet()
    _shared = threading.local()  # one pool per thread that runs steps

    @classmethod
    def shared(cls, workers: int, preload: tuple[str, ...] = ()) -> LocalPool:
        """This thread's pool of `workers` processes, started on first use and kept for every step (`preload`:
        modules a new pool's workers import as they start)."""
        pool = getattr(cls._shared, "pool", None)
        if pool is None or pool._closed or pool.size != workers:
            if pool is not None:
                pool.close()
            pool = cls._shared.pool = LocalPool(workers, preload)
        return pool

    @classmethod
    def close_all(cls) -> None:
        for pool in list(cls._live):
            pool.close()

    @classmethod
    def kill_all(cls) -> None:
        """Stop every pool of this process at once (Ctrl-C)."""
        for pool in list(cls._live):
            pool.kill()

    def __init__(self, workers: int, preload: tuple[str, ...] = ()):
        if workers < 1:
            raise ValueError("a pool needs at least one worker")
        self.size, self.preload = workers, tuple(preload)
        self._events: queue.Queue = queue.Queue()
        self._pending: collections.deque[_Task] = collections.deque()
        self._workers: dict[int, _Worker] = {}
        self._next_ticket = self._next_worker = self._startup_failures = 0
        self._closed = False
        LocalPool._live.add(self)
        for _ in range(workers):
            self._spawn()

    # ------------------------------------------------------------------ public

    def submit(self, fn: Callable, *args: Any, **kwargs: Any) -> int:
        """Queue fn(*args, **kwargs); returns its ticket."""
        self._next_ticket += 1
        self._pending.append(_Task(self._next_ticket, task_name(fn), args, kwargs))
        self._dispatch()
        return self._next_ticket

    def submit_alone(self, fn: Callable, *args: Any, **kwargs: Any) -> int:
        """Queue fn(*args, **kwargs) ahead of the waiting tasks, to run once no other task is in flight and with
        none beside it; returns its ticket."""
        self._next_ticket += 1
        self._pending.appendleft(_Task(self._next_ticket, task_name(fn), args, kwargs, alone=True))
        self._dispatch()
        return self._next_ticket

    @property
    def in_flight(self) -> int:
        """Tasks submitted whose outcome has not been handed out."""
        return len(self._pending) + sum(len(w.outstanding) for w in self._workers.values())

    def results(self, block: bool = False) -> Iterator[tuple[int, Outcome]]:
        """Outcomes of finished tasks: those ready now, or (block) at least one, waiting for it."""
        got = False
        while True:
            try:
                event = self._events.get(block=block and not got and self.in_flight > 0)
            except queue.Empty:
                return
            out = self._handle(event)
            if out is not None:
                got = True
                yield out

    def drain(self) -> Iterator[tuple[int, Outcome]]:
        """Every remaining task's outcome, waiting for all of them."""
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

    def _spawn(self) -> None:
        proc = subprocess.Popen([sys.executable, "-m", "beam_jobs.local.worker", *self.preload], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1", POOL_WORKER: "1"},
                                start_new_session=True)
        wid = self._next_worker
        self._next_worker += 1
        inbox: queue.Queue = queue.Queue()
        self._workers[wid] = _Worker(proc, collections.deque(), inbox)
        threading.Thread(target=self._read, args=(wid, proc), daemon=True, name=f"local-pool-{wid}").start()
        threading.Thread(target=_send_all, args=(proc, inbox), daemon=True, name=f"local-pool-send-{wid}").start()

    def _read(self, wid: int, proc: subprocess.Popen) -> None:
        try:
            while True:
                self._events.put(("answer", wid, receive(proc.stdout)))
        except (EOFError, OSError, pickle.UnpicklingError):
            proc.wait()
            self._events.put(("died", wid, proc.returncode))
        except Exception as exc:  # noqa: BLE001 - an answer this process cannot read: fail the build, not hang
            proc.kill()
            self._events.put(("unreadable", wid, f"{type(exc).__name__}: {exc}"))

    def _dispatch(self) -> None:
        """Hand pending tasks to the least busy workers; their sender threads write them, so a task larger
        than a pipe's buffer never blocks this thread while its worker is busy. A task to run alone waits for
        every other to end, and none starts beside it."""
        busy = [t for w in self._workers.values() for t in w.outstanding]
        if any(t.alone for t in busy):
            return
        for w in sorted(self._workers.values(), key=lambda w: len(w.outstanding)):
            while self._pending and len(w.outstanding) < DEPTH:
                if self._pending[0].alone and (busy or w.outstanding):
                    return
                task = self._pending.popleft()
                w.inbox.put((task.ticket, task.fn, task.args, task.kwargs))
                w.outstanding.append(task)
                busy.append(task)
                if task.alone:
                    return

    def _handle(self, event) -> tuple[int, Outcome] | None:
        kind, wid, payload = event
        w = self._workers.get(wid)
        if w is None:
            return None
        if kind == "unreadable":
            raise RuntimeError(f"local pool: cannot read a worker's answer ({payload})")
        if kind == "answer":
            ticket, ok, value = payload
            task = w.outstanding.popleft()
            if task.ticket != ticket:
                raise RuntimeError(f"local pool: a worker answered task {ticket}, expected {task.ticket}")
            w.answered = True
            self._startup_failures = 0
            self._dispatch()
            return ticket, (Done(value) if ok else Raised(value))
        # The worker died: the first task it held crashed it; the others never started and go back in line.
        del self._workers[wid]
        if self._closed:
            return None
        if not w.answered:
            self._startup_failures += 1
            if self._startup_failures >= MAX_STARTUP_FAILURES:
                raise RuntimeError(f"local pool: worker processes exit at start-up (exit code {payload}); "
                                   "run with --workers 1 to see why")
        out = None
        if w.outstanding:
            crashed = w.outstanding.popleft()
            self._pending.extendleft(reversed(w.outstanding))
            out = (crashed.ticket, Crashed(describe_exit(payload), killed=payload == -signal.SIGKILL))
        self._spawn()
        self._dispatch()
        return out


def _send_all(proc: subprocess.Popen, inbox: queue.Queue) -> None:
    """Write a worker's messages to its pipe in order; a broken pipe stops it (its reader reports the death)."""
    while True:
        message = inbox.get()
        try:
            send(proc.stdin, message)
        except (BrokenPipeError, OSError, ValueError):
            return
        del message


def describe_exit(code: int | None) -> str:
    if code == -signal.SIGKILL:
        return "the worker process was killed (SIGKILL), as the system does when memory runs out"
    if code is not None and code < 0:
        try:
            return f"the decoder crashed the worker process ({signal.Signals(-code).name})"
        except ValueError:
            return f"the decoder crashed the worker process (signal {-code})"
    return f"the worker process exited with code {code}"
