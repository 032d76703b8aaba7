"""A local worker process: answers (ticket, function name, args, kwargs) messages until its input closes.

Started as `python -m beam_jobs.local.worker` by LocalPool; imports no Beam."""
from __future__ import annotations

import importlib
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


if __name__ == "__main__":
    main()
