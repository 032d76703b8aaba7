"""Progress of a build: bars on the terminal for a local run, counter lines while a Dataflow job runs.

Local runs: the job's steps call the module-level API from the driver process (Beam's in-process runner runs
DoFns in the driver's threads; results of an encode process pool arrive there too). Every call is a no-op
until `start()` enabled it, in another process (a Beam or pool worker) and after `stop()`, so steps call it
unconditionally:

    progress.expect("encode")          # one more item the phase will handle (its total grows)
    progress.total("write", n)         # the phase's total, once known
    progress.advance("encode", n=1)    # items done

Phases are `list`, `encode` and `write`; each gets a tqdm bar with its count, rate and ETA. Bars show only
when stderr is a terminal, unless `--progress` / `--no-progress` (see `add_argument`) says otherwise.
Bars need tqdm, which the base install brings.
"""
from __future__ import annotations

import argparse
import io
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from shard_utils.extras import MissingExtra, require

__all__ = [
    "PHASES", "add_argument", "start", "stop", "showing", "advance", "total", "expect", "counts", "console_url",
    "counter_totals", "counter_line", "watch"
]

PHASES = {"list": ("listing", "files"), "encode": ("encoding", "images"), "write": ("writing", "records")}


class _Bars:
    """The tqdm bars of one run, made on first use of each phase; every change under one lock."""

    def __init__(self, stream: TextIO, tqdm_class: Any) -> None:
        self.stream = stream
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.tqdm = tqdm_class
        self.bars: dict[str, Any] = {}
        self.done: dict[str, int] = {}
        self.totals: dict[str, int | None] = {}

    def _bar(self, phase: str):
        if phase not in PHASES:
            raise ValueError(f"unknown progress phase {phase!r}; expected one of {', '.join(PHASES)}")
        if phase not in self.bars:
            description, unit = PHASES[phase]
            width = _columns(self.stream)  # a terminal reporting 0 columns (some containers) gets 80
            self.bars[phase] = self.tqdm(total=self.totals.get(phase), desc=f"{description:<9}", unit=f" {unit}",
                                         file=self.stream, position=len(self.bars), leave=True,
                                         dynamic_ncols=width != 0, ncols=80 if width == 0 else None,
                                         nrows=24 if width == 0 else None,
                                         mininterval=0.2, smoothing=0.1)
            self.done.setdefault(phase, 0)
        return self.bars[phase]

    def advance(self, phase: str, n: int) -> None:
        with self.lock:
            self._bar(phase).update(n)
            self.done[phase] = self.done.get(phase, 0) + n

    def set_total(self, phase: str, n: int, add: bool) -> None:
        with self.lock:
            bar = self._bar(phase)
            self.totals[phase] = (self.totals.get(phase) or 0) + n if add else n
            bar.total = self.totals[phase]
            if not add:  # a total set once is shown now; a growing one at the next (rate-limited) update
                bar.refresh()

    def close(self) -> None:
        with self.lock:
            for bar in self.bars.values():
                bar.close()


_active: _Bars | None = None
_start_lock = threading.Lock()


def add_argument(parser: argparse.ArgumentParser) -> None:
    """Add --progress / --no-progress (default: bars only when stderr is a terminal)."""
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="show progress bars for listing, encoding and writing (default: only when stderr is "
                             "a terminal; local runs)")


def start(enabled: bool | None = None, stream: TextIO | None = None) -> bool:
    """Turn progress on for this process: enabled=None shows bars only if `stream` (stderr) is a terminal.
    Returns whether bars will show. Forcing bars without tqdm installed raises MissingExtra."""
    global _active
    stream = stream if stream is not None else sys.stderr
    if enabled is None:
        enabled = _is_terminal(stream)
        if enabled:
            try:
                tqdm_module = require("tqdm", None, "--progress")
            except MissingExtra:  # not asked for explicitly: build without bars
                enabled = False
    elif enabled:
        tqdm_module = require("tqdm", None, "--progress")
    with _start_lock:
        if _active is not None:
            _active.close()
        _active = _Bars(stream, tqdm_module.tqdm) if enabled else None
    return enabled


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def _columns(stream: TextIO) -> int | None:
    """The terminal's width, 0 if it reports none, None if the stream is no terminal."""
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError, io.UnsupportedOperation):
        return None


def stop() -> None:
    """Close the bars (leaving their last state on screen) and turn progress off."""
    global _active
    with _start_lock:
        bars, _active = _active, None
    if bars is not None:
        bars.close()


@contextmanager
def showing(enabled: bool | None = None, stream: TextIO | None = None) -> Iterator[bool]:
    """`start()` for the block, `stop()` after it, whatever happens inside."""
    try:
        yield start(enabled, stream)
    finally:
        stop()


def _current() -> _Bars | None:
    bars = _active
    return bars if bars is not None and bars.pid == os.getpid() else None


def advance(phase: str, n: int = 1) -> None:
    """n more items of phase done."""
    bars = _current()
    if bars is not None:
        bars.advance(phase, n)


def total(phase: str, n: int) -> None:
    """The phase will handle n items in all."""
    bars = _current()
    if bars is not None:
        bars.set_total(phase, n, add=False)


def expect(phase: str, n: int = 1) -> None:
    """The phase will handle n more items (its total grows as listing finds them)."""
    bars = _current()
    if bars is not None:
        bars.set_total(phase, n, add=True)


def counts() -> dict[str, tuple[int, int | None]]:
    """(done, total) per phase shown so far; empty when progress is off."""
    bars = _current()
    if bars is None:
        return {}
    with bars.lock:
        return {p: (bars.done.get(p, 0), bars.totals.get(p)) for p in bars.bars}


# ---------------------------------------------------------------- Dataflow: console URL and counter lines

def console_url(job_id: str, region: str | None, project: str | None) -> str:
    """The Cloud Console page of a Dataflow job."""
    url = f"https://console.cloud.google.com/dataflow/jobs/{region or '-'}/{job_id}"
    return url + (f"?project={project}" if project else "")


def counter_totals(result: Any, committed: bool = True) -> dict[str, int]:
    """The job's counters (namespace tpu_shards) summed over steps: committed values, or attempted ones
    (live while a job runs); empty if the runner reports none."""
    from apache_beam.metrics.metric import MetricsFilter

    from beam_jobs.run.tally import NAMESPACE

    try:
        found = result.metrics().query(MetricsFilter().with_namespace(NAMESPACE))["counters"]
    except Exception:  # a runner without metrics, or a transient API error: the line says "no counters yet"
        return {}
    totals: dict[str, int] = {}
    for c in found:
        first, second = (c.committed, c.attempted) if committed else (c.attempted, c.committed)
        value = first if first is not None else second
        totals[c.key.metric.name] = totals.get(c.key.metric.name, 0) + int(value or 0)
    return totals


def counter_line(totals: dict[str, int], state: str, elapsed: float) -> str:
    """One line: the job's state, time waited, files listed, images encoded and written, rejects by reason."""
    minutes, seconds = divmod(int(elapsed), 60)
    parts = [f"files_matched {totals.get('files_matched', 0)}",
             f"images_encoded {totals.get('images_passed_through', 0) + totals.get('images_reencoded', 0)}",
             f"images_written {totals.get('images_written', 0)}",
             f"shards_written {totals.get('shards_written', 0)}"]
    rejected = {k[len("rejected_"):]: v for k, v in sorted(totals.items()) if k.startswith("rejected_") and v}
    reasons = f" ({', '.join(f'{k} {v}' for k, v in rejected.items())})" if rejected else ""
    parts.append(f"rejected {sum(rejected.values())}{reasons}")
    skipped = sum(v for k, v in totals.items() if k.startswith("skipped_"))
    if skipped:
        parts.append(f"skipped {skipped}")
    return f"tpu-shards: {state} after {minutes}m{seconds:02d}s: " + ", ".join(parts)


def watch(result: Any, interval: float = 30.0, *, project: str | None = None, region: str | None = None,
          out: TextIO | None = None) -> str:
    """Wait for a (Dataflow) job: print its console URL, then a counter line every `interval` seconds and
    once at the end. Returns the final state's name. Errors of the job propagate as wait_until_finish raises."""
    from apache_beam.runners.runner import PipelineState

    out = out if out is not None else sys.stderr
    job_id = getattr(result, "job_id", None)
    job_id = job_id() if callable(job_id) else None
    if job_id:
        print(f"tpu-shards: Dataflow job {job_id}: {console_url(job_id, region, project)}", file=out, flush=True)
    started = time.monotonic()
    while True:
        try:
            result.wait_until_finish(duration=int(interval * 1000))
        except TypeError:  # a runner whose wait takes no duration: it waits to the end
            result.wait_until_finish()
        state = str(result.state)
        finished = PipelineState.is_terminal(result.state)
        line = counter_line(counter_totals(result, committed=finished), state.rsplit(".", 1)[-1],
                            time.monotonic() - started)
        print(line, file=out, flush=True)
        if finished:
            return state.rsplit(".", 1)[-1]
