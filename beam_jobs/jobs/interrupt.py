"""Ctrl-C during a local build: one line saying what state the output is in, exit code 130, no hang.

Beam's in-process runner turns a KeyboardInterrupt raised inside a step into a wrapped RuntimeError,
and its threads can keep the interpreter from exiting. So the first Ctrl-C is handled here: the
encode workers are killed, this run's temporary data and lock are removed (bounded in time), the
state of the output is described, and the process exits at once.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable

from beam_jobs.local.pool import LocalPool
from beam_jobs.run.config import BuildConfig
from shard_utils import storage
from shard_utils.format import manifest
from shard_utils.text import printable

__all__ = ["CLEANUP_SECONDS", "EXIT_CODE", "describe_output", "LocalInterrupts"]

CLEANUP_SECONDS = 10.0
EXIT_CODE = 130


def describe_output(config: BuildConfig, had_dataset: bool) -> str:
    """What an interrupted build left at its output."""
    out = config.output
    try:
        current = manifest.load(out) if storage.exists(storage.join(out, manifest.MANIFEST_NAME)) else None
    except Exception:  # noqa: BLE001 - describing must not fail the exit
        current = None
    if current is not None:
        if current.created == config.created:
            return f"the new dataset at {out} was published before the interrupt"
        return f"the dataset at {out} is unchanged"
    if had_dataset:
        return (f"the previous dataset at {out} was already removed while the new one was being published; "
                "rerun with --overwrite to build it again")
    return f"nothing was published to {out}"


class LocalInterrupts:
    """Within the block, the first SIGINT ends the build as described above."""

    def __init__(self, config: BuildConfig, had_dataset: bool, abandon: Callable[[BuildConfig, str], None]):
        """`abandon(config, run_id)` removes the run's temporary data and gives its lock back."""
        self.config, self.had_dataset, self.abandon = config, had_dataset, abandon
        self._previous = None

    def __enter__(self) -> LocalInterrupts:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)

    def _handle(self, signum, frame) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not interrupt the clean-up
        LocalPool.kill_all()
        state = []

        def clean() -> None:
            state.append(describe_output(self.config, self.had_dataset))
            self.abandon(self.config, self.config.run_id)

        worker = threading.Thread(target=clean, daemon=True)
        worker.start()
        worker.join(CLEANUP_SECONDS)
        what = state[0] if state else f"the state of {self.config.output} could not be checked in time"
        print(f"tpu-shards: interrupted; {printable(what)}", file=sys.stderr, flush=True)
        os._exit(EXIT_CODE)
