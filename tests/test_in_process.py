"""Beam's in-process runner within `in_process_run`: pickles zlib (bz2 outside, for remote workers) and read
either way, stages unsampled and made in the calling thread, and the same results and counters as outside."""
from __future__ import annotations

import base64
import bz2
import threading
import zlib

import apache_beam as beam
import pytest
from apache_beam.internal import cloudpickle_pickler, pickler
from apache_beam.metrics.metric import Metrics, MetricsFilter
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.runners.worker import statesampler
from apache_beam.testing.util import assert_that, equal_to

from beam_jobs.jobs.checks import pipeline_options
from beam_jobs.jobs.in_process import in_process_run
from beam_jobs.jobs.running import runs_here

UNPICKLED_IN: list[str] = []  # the threads a _Seen DoFn was unpickled in


def _scale(x: int, by: int = 3) -> int:
    return x * by


class _Seen(beam.DoFn):
    """Emits (element, whether a sampling thread runs) and counts its elements."""

    def __setstate__(self, state: dict) -> None:
        UNPICKLED_IN.append(threading.current_thread().name)
        self.__dict__.update(state)

    def process(self, x: int):
        Metrics.counter("test", "seen").inc(x)
        tracker = statesampler.get_current_tracker()
        yield x, any(getattr(t, "_target", None) == tracker.run for t in threading.enumerate())


def test_pickles_are_zlib_within_the_block_bz2_outside_and_read_either_way():
    value = {"fn": _scale, "config": list(range(500))}
    outside = pickler.dumps(value)
    with in_process_run():
        with in_process_run():  # nested: still one layer over Beam's own
            nested = pickler.dumps(value)
        within = pickler.dumps(value)
    after = pickler.dumps(value)
    beams_own = (cloudpickle_pickler.dumps.beams, cloudpickle_pickler.loads.beams)
    assert not any(hasattr(own, "beams") for own in beams_own)
    assert bz2.decompress(base64.b64decode(outside)) == bz2.decompress(base64.b64decode(after))
    assert zlib.decompress(base64.b64decode(within)) == zlib.decompress(base64.b64decode(nested))
    for made in (outside, within, after, within.decode("ascii")):
        assert pickler.loads(made)["fn"](2) == 6 and pickler.loads(made)["config"] == list(range(500))
    coder = pickler.dumps(value, use_zlib=True)  # Beam's coders ask for zlib themselves
    assert pickler.loads(coder, use_zlib=True)["config"][-1] == 499


def _run(sampled: bool) -> tuple[int, set[str]]:
    """Run a small graph, checking its values and whether a sampling thread ran beside its DoFn; (its counter's
    value, the threads its DoFn was unpickled in by the runner)."""
    p = beam.Pipeline(runner=FnApiRunner())
    out = p | beam.Create([1, 2, 3]) | beam.Map(_scale, by=5) | beam.ParDo(_Seen())
    assert_that(out, equal_to([(5, sampled), (10, sampled), (15, sampled)]))
    UNPICKLED_IN.clear()
    result = p.run()
    result.wait_until_finish()
    counter = result.metrics().query(MetricsFilter().with_name("seen"))["counters"][0].committed
    return counter, set(UNPICKLED_IN)


def test_a_graph_run_within_the_block_gives_the_same_results_and_counters_unsampled_in_the_calling_thread():
    here = threading.current_thread().name
    with in_process_run():
        counter, threads = _run(sampled=False)
    assert counter == 30 and threads == {here}
    counter, threads = _run(sampled=True)
    assert counter == 30 and any(name.startswith("ExecutionTreeCreator") for name in threads)


@pytest.mark.parametrize("beam_args, here", [
    ([], True), (["--runner=DirectRunner", "--direct_running_mode=multi_threading"], True),
    (["--direct_num_workers=2", "--direct_running_mode=multi_processing"], False),  # Beam's worker subprocesses
    (["--template_location=/tmp/t.json"], False), (["--runner=DataflowRunner"], False)])
def test_only_a_graph_run_in_this_process_is_run_so(beam_args, here):
    assert runs_here(pipeline_options(beam_args)) is here
