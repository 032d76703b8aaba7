"""Beam's in-process runner within `in_process_run`: pickles zlib (bz2 outside, for remote workers) and read
either way, stages unsampled and made in the calling thread, and the same results and counters as outside; only in
the block's thread and the runner's threads working for it (a graph made meanwhile in another thread is Beam's own)."""
from __future__ import annotations

import base64
import bz2
import contextlib
import json
import threading
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.internal import cloudpickle_pickler, pickler
from apache_beam.metrics.metric import Metrics, MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.runners.worker import statesampler
from apache_beam.testing.util import assert_that, equal_to

from beam_jobs.jobs.checks import pipeline_options
from beam_jobs.jobs.in_process import in_process_run
from beam_jobs.jobs.running import runs_here
from shard_utils import storage

UNPICKLED_IN: list[str] = []  # the threads a _Seen DoFn was unpickled in
HOLDING, RELEASED = threading.Event(), threading.Event()  # a held step has started; it may end


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


def _held_open(x: int) -> int:
    """Keeps its bundle, and so the in-process run around it, going until released (at most 30 s)."""
    HOLDING.set()
    assert RELEASED.wait(30)
    return x


def _in_thread(fn: Callable[[], Any]) -> Any:
    """fn's result (or its exception), called in a thread of its own."""
    done: list = []
    thread = threading.Thread(target=lambda: done.append(_outcome(fn)))
    thread.start()
    thread.join(60)
    assert done, "the thread did not finish in 60 s"
    if isinstance(done[0], BaseException):
        raise done[0]
    return done[0]


def _outcome(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except BaseException as exc:  # noqa: BLE001 - raised again in the calling thread
        return exc


@contextlib.contextmanager
def _held_build(graph: Callable[[beam.Pipeline], None]) -> Iterator[None]:
    """Within the `with`, a graph (`graph` adds its steps, holding with _held_open) runs within a block in another
    thread, held open; it is let go and must have ended cleanly (its values checked) when the `with` ends."""
    def run_held_open() -> None:
        with in_process_run():
            p = beam.Pipeline(runner=FnApiRunner())
            graph(p)
            p.run().wait_until_finish()

    HOLDING.clear()
    RELEASED.clear()
    outcome: list = []
    held = threading.Thread(target=lambda: outcome.append(_outcome(run_held_open)))
    held.start()
    try:
        assert HOLDING.wait(30), "the in-process run did not start in 30 s"
        yield
    finally:
        RELEASED.set()
        held.join(30)
    assert outcome == [None]


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


def test_a_pickle_made_in_another_thread_while_a_block_is_open_is_beams_own_bz2():
    value = {"fn": _scale, "config": list(range(500))}
    with in_process_run():
        elsewhere = _in_thread(lambda: pickler.dumps(value))
        within = pickler.dumps(value)
        read_elsewhere = _in_thread(lambda: pickler.loads(within))  # read either way in any thread
    assert bz2.decompress(base64.b64decode(elsewhere)) == zlib.decompress(base64.b64decode(within))
    assert read_elsewhere["fn"](2) == 6


def _run(sampled: bool, beam_args: tuple[str, ...] = ()) -> tuple[int, set[str]]:
    """Run a small graph, checking its values and whether a sampling thread ran beside its DoFn; (its counter's
    value, the threads its DoFn was unpickled in by the runner)."""
    p = beam.Pipeline(runner=FnApiRunner(), options=PipelineOptions(list(beam_args)))
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


@pytest.mark.parametrize("beam_args", [
    ("--direct_num_workers=2", "--direct_running_mode=in_memory"),  # bundles in Beam's shared thread pool
    ("--direct_num_workers=2", "--direct_running_mode=multi_threading")])  # an SDK harness's threads, over gRPC
def test_the_runners_own_threads_run_a_graph_of_the_block_as_its_thread_does(beam_args):
    here = threading.current_thread().name
    with in_process_run():
        counter, threads = _run(sampled=False, beam_args=beam_args)
    assert counter == 30 and threads and here not in threads
    assert not any(name.startswith("ExecutionTreeCreator") for name in threads)


def test_a_template_made_in_another_thread_during_an_in_process_run_has_beams_own_pickles(gcs, tmp_path):
    """While a graph runs within a block in one thread, a Dataflow template made in another is what stock Beam
    writes: its functions' pickles bz2, read by Beam's own unpickler as Dataflow's workers read them."""
    def graph(p: beam.Pipeline) -> None:
        assert_that(p | beam.Create([1, 2]) | beam.Map(_held_open), equal_to([1, 2]))

    with _held_build(graph):
        tmp, template = gcs.new_bucket("tpl"), tmp_path / "template.json"
        p = beam.Pipeline(options=PipelineOptions([
            "--runner=DataflowRunner", "--project=local-emulator", "--region=us-central1",
            f"--temp_location=gs://{tmp}/tmp", f"--template_location={template}",
            "--experiments=disable_logging_submission_environment"]))
        _ = p | beam.Create([1, 2]) | beam.Map(_scale, by=7) | beam.ParDo(_Seen())
        p.run()
    url = json.loads(template.read_text())["environment"]["sdkPipelineOptions"]["options"]["pipelineUrl"]
    bucket, name = storage.split_gcs(url)
    graph = beam_runner_api_pb2.Pipeline.FromString(gcs.client.bucket(bucket).blob(name).download_as_bytes())
    fns = {t.unique_name: beam_runner_api_pb2.ParDoPayload.FromString(t.spec.payload).do_fn.payload
           for t in graph.components.transforms.values() if t.spec.urn == common_urns.primitives.PAR_DO.urn}
    beams_loads = cloudpickle_pickler.loads.beams  # installed by the block; its default is bz2, as on the workers
    assert {"Map(_scale)", "ParDo(_Seen)"} <= fns.keys()
    assert all(bz2.decompress(base64.b64decode(payload)) for payload in fns.values())
    (fn, _, kwargs, *_), (dofn, *_) = beams_loads(fns["Map(_scale)"]), beams_loads(fns["ParDo(_Seen)"])
    assert fn.process(2, **kwargs) == [14] and isinstance(dofn, _Seen)


@pytest.mark.parametrize("beam_args, here", [
    ([], True), (["--runner=DirectRunner", "--direct_running_mode=multi_threading"], True),
    (["--direct_num_workers=2", "--direct_running_mode=multi_processing"], False),  # Beam's worker subprocesses
    (["--template_location=/tmp/t.json"], False), (["--runner=DataflowRunner"], False)])
def test_only_a_graph_run_in_this_process_is_run_so(beam_args, here):
    assert runs_here(pipeline_options(beam_args)) is here


def test_a_block_left_by_an_exception_or_an_interrupt_leaves_its_thread_outside():
    value = {"fn": _scale}
    for raised in (ValueError("in the block"), KeyboardInterrupt()):
        with pytest.raises(type(raised)):
            with in_process_run(), in_process_run():
                assert zlib.decompress(base64.b64decode(pickler.dumps(value)))
                raise raised
        assert bz2.decompress(base64.b64decode(pickler.dumps(value)))


def test_two_builds_in_two_threads_at_once_each_run_within_its_own_block():
    """While a build in another thread is held open within its block, this thread's block starts, runs a graph and
    ends: both run unsampled with their own counters, and this block's end leaves the other's as it was."""
    def graph(p: beam.Pipeline) -> None:
        out = p | beam.Create([1, 2]) | beam.Map(_held_open) | beam.ParDo(_Seen())
        assert_that(out, equal_to([(1, False), (2, False)]))  # processed after this thread's block has ended

    with _held_build(graph):
        with in_process_run():
            assert _run(sampled=False) == (30, {threading.current_thread().name})
        assert bz2.decompress(base64.b64decode(pickler.dumps({"fn": _scale})))
