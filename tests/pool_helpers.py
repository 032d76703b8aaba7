"""Functions the local-pool tests run in worker processes (the workers import them by name)."""
import os
import signal
import time


def square_or_crash(item, pause: float = 0.0):
    """The square of a number; 'segv' kills the worker, 'slow' answers after `pause` seconds."""
    if item == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    if item == "slow":
        time.sleep(pause)
        return "slow"
    return item * item


def interval(pause: float) -> tuple[float, float]:
    """When this task ran: (start, end) on the wall clock, `pause` seconds apart."""
    start = time.time()
    time.sleep(pause)
    return start, time.time()


def fail_with_message(name):
    raise ValueError(f"cannot use {name!r}: a message the build should show")


class _Unloadable:
    """An answer the worker can pickle and the build cannot unpickle."""

    def __reduce__(self):
        return _refuse_to_load, ()


def _refuse_to_load():
    raise ValueError("this answer cannot be loaded here")


def answer_unloadable(_):
    return _Unloadable()


def imported(names: list[str]) -> list[bool]:
    """Whether each module was already imported in this worker when the task ran."""
    import sys

    return [name in sys.modules for name in names]


def weigh_or_crash(items, settings):
    """weigh_sample, except that a part holding an item named crash-*.png kills the worker process it runs in (never
    the test's own process, whose pid DRIVER_PID names): the driver then weighs that part itself."""
    from shard_utils.sharding.encode_run import weigh_sample

    if os.getpid() != int(os.environ["DRIVER_PID"]) and any("crash-" in item.uri for item in items):
        os.kill(os.getpid(), signal.SIGSEGV)
    return weigh_sample(items, settings)
