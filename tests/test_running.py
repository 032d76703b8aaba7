"""How a job runs on Beam's in-process runner: the state sampler that ends each stage."""
from __future__ import annotations

import apache_beam as beam
from apache_beam.metrics import Metrics, MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.worker import statesampler

from beam_jobs import running


def _record_period(_) -> None:
    Metrics.distribution("test", "period").update(statesampler.get_current_tracker().sampling_period_ms)


def _sampling_periods() -> list[int]:
    """The state-sampling period of the stage that runs a DoFn, seen from inside it, on the in-process runner."""
    p = beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"]))
    _ = p | beam.Create([1, 2]) | beam.Map(_record_period)
    result = p.run()
    result.wait_until_finish()
    (dist,) = result.metrics().query(MetricsFilter().with_name("period"))["distributions"]
    return sorted({dist.committed.min, dist.committed.max})


def test_local_stages_sample_every_10_ms_and_beams_default_comes_back_after():
    default = statesampler.DEFAULT_SAMPLING_PERIOD_MS
    with running.quick_stage_ends(True):
        assert _sampling_periods() == [running.LOCAL_SAMPLING_MS]
    assert _sampling_periods() == [default]
    with running.quick_stage_ends(False):  # Dataflow, or a template: Beam's own
        assert _sampling_periods() == [default]


def test_a_local_build_runs_with_quick_stage_ends_and_restores_beams(images, tmp_path, monkeypatch):
    from conftest import run_job

    seen = []
    original = running.start_local_pool
    monkeypatch.setattr(running, "start_local_pool", lambda config, opts: (
        seen.append(statesampler.StateSampler.__init__.__defaults__), original(config, opts)))
    m = run_job(images, tmp_path / "out", "--num-cores", "2", "--no-progress")
    assert m.splits["train"].num_records == 36
    assert seen == [(running.LOCAL_SAMPLING_MS,)]
    assert statesampler.StateSampler.__init__.__defaults__ == (statesampler.DEFAULT_SAMPLING_PERIOD_MS,)


def test_the_objects_from_before_the_first_run_are_left_out_of_the_collectors_passes_once(images, tmp_path):
    import gc

    from conftest import run_job

    run_job(images, tmp_path / "a", "--no-progress")
    frozen = gc.get_freeze_count()
    assert frozen > 50_000  # Beam's and the job's modules, at least
    run_job(images, tmp_path / "b", "--no-progress")
    assert gc.get_freeze_count() == frozen  # a later run's objects, its garbage among them, are collected as usual
