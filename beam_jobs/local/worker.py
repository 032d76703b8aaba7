"""A local worker process: answers (ticket, function name, args, kwargs) messages until its input closes.

Started as `python -m beam_jobs.local.worker [MODULE...]` by LocalPool; imports the modules named (the tasks'
own, so their import overlaps the build's graph construction, not its first task), and no Beam."""
from __future__ import annotations

import atexit
import importlib
import os
import pickle
import signal
import sys
from collections.abc import Callable

from beam_jobs.local.wire import receive, send

__all__ = ["main"]


def _die_with_parent() -> None:
    """Ask Linux to kill this worker when its parent dies, so a killed build leaves no orphans."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux: workers still exit when their input pipe closes
        pass


def _resolve(name: str) -> Callable:
    module, _, qualname = name.partition(":")
    found = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


def _preload(modules: list[str]) -> None:
    """Import the modules the tasks will need; one that fails is left to fail the task that needs it."""
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001 - the task importing it reports the error where it is raised
            pass


def _picklable(exc: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - any failure means: send its text instead
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _die_with_parent()
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but answers may go to the pipe
    _preload(sys.argv[1:])
    functions: dict[str, Callable] = {}
    while True:
        try:
            ticket, name, args, kwargs = receive(stdin)
        except EOFError:
            return
        try:
            if name not in functions:
                functions[name] = _resolve(name)
            answer = (ticket, True, functions[name](*args, **kwargs))
        except Exception as exc:  # noqa: BLE001 - raised again in the build, with its message
            answer = (ticket, False, _picklable(exc))
        send(stdout, answer)
        del args, kwargs, answer  # nothing held while waiting for the next task


def _exit_now() -> None:
    """Exit as soon as the input closes: the exit handlers run and the streams are flushed, but the modules
    (NumPy, Pillow, protobuf) are not torn down one by one while the build waits for its workers to end."""
    atexit._run_exitfuncs()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
    _exit_now()
