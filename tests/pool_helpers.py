"""Functions the local-pool tests run in worker processes (imported by name there)."""
import os
import signal
import time


def square_or_crash(items, settings):
    """Squares numbers; the item 'segv' kills the worker, 'slow' sleeps first."""
    out = []
    for item in items:
        if item == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        if item == "slow":
            time.sleep(settings)
            out.append("slow")
            continue
        out.append(item * item)
    return out


_kept: list = []  # what keep_or_crash holds in this worker until release_kept writes it


def keep_or_crash(items, replay=False):
    """Holds numbers in the worker (as an encoder holds its fragment buffer); 'segv' kills the worker.
    Returns ([how many it took], released=False); a replay returns no count (it was given already)."""
    for item in items:
        if item == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
    _kept.extend(items)
    return ([] if replay else [len(items)]), False


def release_kept(items, folder):
    """Writes what this worker holds to a new file under `folder`: ([its path], released=True)."""
    import json

    path = os.path.join(folder, f"{os.getpid()}-{time.time_ns()}.json")
    with open(path, "w") as out:
        json.dump(_kept, out)
    _kept.clear()
    return [path], True


def fail_with_message(items):
    raise ValueError(f"cannot use {items[0]!r}: a message the build should show")


def loaded_modules(items, names):
    """Which of the named modules this worker had imported before the task ran."""
    import sys

    return [name for name in names if name in sys.modules]


def sleep_then(items, seconds, answer):
    """Work started early: waits, then answers (or dies on 'segv', or raises on 'fail')."""
    time.sleep(seconds)
    if answer == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    if answer == "fail":
        raise ValueError("the early work failed")
    return answer
