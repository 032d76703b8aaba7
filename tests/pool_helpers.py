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
