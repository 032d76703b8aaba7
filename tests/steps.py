"""Running one step of the build's graph on its own: a config for a folder, the steps before it run once and
kept as plain values, and a TestPipeline on Beam's in-process runner (FnApiRunner: no Prism download)."""
from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from pathlib import Path

import apache_beam as beam
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.testing.test_pipeline import TestPipeline

from beam_jobs.jobs import options
from beam_jobs.jobs.checks import prepare_inputs
from beam_jobs.run.config import BuildConfig
from beam_jobs.run.identity import RunInfo
from beam_jobs.run.tally import NAMESPACE
from shard_utils import storage
from shard_utils.inputs import MediaItem
from shard_utils.inputs import walk as media_listing

CREATED = "2026-01-02T03:04:05+00:00"
_KEPT: dict[str, list] = {}  # what kept() saw, by token: the FnApiRunner runs the steps in this process
_LOCK = threading.Lock()


def step_config(tmp_path: Path, input_dir: Path | None, *args: str, run_id: str = "run1") -> BuildConfig:
    """The BuildConfig a local build would have for these options (one worker: steps run inline)."""
    given = ["--input", str(input_dir)] if input_dir is not None else []
    parsed, _ = options.parse([*given, "--output", str(tmp_path / "out"), *args])
    listing, split_dirs = prepare_inputs(parsed)
    return options.make_config(parsed, split_dirs, workers=1, temp_root=str(tmp_path / "out" / ".tmp"),
                               run_id=run_id, created=CREATED, listing=listing, local=True)


def run_info(config: BuildConfig) -> RunInfo:
    assert config.run_id is not None
    return RunInfo(config.run_id, config.temp_dir(config.run_id), config.created or "")


def media_chunks(config: BuildConfig, size: int = 5) -> list[list[MediaItem]]:
    """The input folder's media (as ListMedia finds them), in chunks of `size`: what PlanLayout takes."""
    assert config.input is not None
    found = media_listing.sort_chunk(list(storage.walk(config.input, False)), config.split_dirs, config.input,
                                     config.listing)
    media = sorted(found.media, key=lambda item: item.source_id)
    return [media[i:i + size] for i in range(0, len(media), size)]


def pipeline() -> TestPipeline:
    return TestPipeline(runner="FnApiRunner")


def run(p: beam.Pipeline):
    """Run a pipeline to its end; returns its PipelineResult."""
    result = p.run()
    result.wait_until_finish()
    return result


def counters(result) -> dict[str, int]:
    """The job's counters (namespace tpu_shards) as the runner committed them."""
    found = result.metrics().query(MetricsFilter().with_namespace(NAMESPACE))["counters"]
    out: dict[str, int] = {}
    for c in found:
        out[c.key.metric.name] = out.get(c.key.metric.name, 0) + c.committed
    return out


def string_sets(result) -> dict[str, set]:
    found = result.metrics().query(MetricsFilter().with_namespace(NAMESPACE)).get("string_sets", [])
    return {c.key.metric.name: set(c.committed) for c in found}


def kept(pcoll, label: str) -> Callable[[], list]:
    """Keep every element of pcoll; the returned function gives them once the pipeline has run."""
    token = uuid.uuid4().hex
    with _LOCK:
        _KEPT[token] = []
    _ = pcoll | label >> beam.Map(_keep, token)
    return lambda: _KEPT.pop(token)


def _keep(value, token: str) -> None:
    with _LOCK:
        _KEPT[token].append(value)


def outputs(build: Callable[[beam.Pipeline], dict]) -> tuple[dict[str, list], object]:
    """Run `build(p)` (returning {name: PCollection}) once; returns ({name: its elements}, the PipelineResult).
    How a step's inputs are made from the steps before it."""
    p = pipeline()
    got = {name: kept(pcoll, f"Keep{name}") for name, pcoll in build(p).items()}
    result = run(p)
    return {name: get() for name, get in got.items()}, result


def files_under(folder: Path) -> dict[str, bytes]:
    """Every file below a folder (relative path -> bytes)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def twice_at_once(fn: Callable[[], object]) -> list:
    """fn run in two threads at the same time; returns both results (re-raises the first error)."""
    results: list = [None, None]
    errors: list = []
    start = threading.Barrier(2)

    def go(i: int) -> None:
        try:
            start.wait()
            results[i] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    return results


# ---------------------------------------------------------------- the steps before a step, run once

def created(p: beam.Pipeline, label: str, values: list):
    """A PCollection of these values, pickled like a step's outputs. (beam.Create infers a coder from the values,
    and picks 64-bit signed ints for the unsigned order keys.)"""
    return p | f"{label}Impulse" >> beam.Impulse() | label >> beam.FlatMap(_each, values)


def _each(_, values: list):
    yield from values


def labels_of(chunks: list[list[MediaItem]]) -> list[str]:
    return sorted({name for chunk in chunks for item in chunk for name in item.labels})


def laid_out(config: BuildConfig, chunks: list[list[MediaItem]] | None = None) -> dict[str, list]:
    """PlanLayout's outputs for the input folder: keyed (chunks), layouts (one dict), failure."""
    from beam_jobs.pipeline.plan_runs import PlanLayout

    def build(p):
        out = p | beam.Create(chunks if chunks is not None else media_chunks(config)) | PlanLayout(config)
        return {"keyed": out["keyed"], "layouts": out["layouts"], "failure": out["failure"]}

    return outputs(build)[0]


def encode_inputs(p: beam.Pipeline, config: BuildConfig, laid: dict[str, list], labels: list[str]):
    """EncodeRuns' inputs as PCollections: keyed chunks, layouts, label names, the run."""
    return (created(p, "Keyed", laid["keyed"]), created(p, "Layouts", laid["layouts"]),
            created(p, "LabelNames", labels), created(p, "Run", [run_info(config)]))


def encoded_runs(config: BuildConfig, laid: dict[str, list], labels: list[str]) -> list:
    """EncodeRuns' runs (EncodedRun), written under the run's temporary folder."""
    from beam_jobs.pipeline.encode import EncodeRuns

    def build(p):
        keyed, layouts, names, run_ = encode_inputs(p, config, laid, labels)
        return {"runs": (keyed | EncodeRuns(config, layouts, names, run_)).runs}

    return outputs(build)[0]["runs"]


def planned_shards(config: BuildConfig, laid: dict[str, list], runs: list, dropped: list | None = None) -> dict:
    """PlanShards' outputs (tasks, plans, failure) for encoded runs."""
    from beam_jobs.pipeline.shards import PlanShards
    from shard_utils.sharding.naming import ShardNaming

    def build(p):
        drops = created(p, "Dropped", dropped) if dropped is not None else None
        naming = ShardNaming.for_build(config.shard_extension)
        return created(p, "Runs", runs) | PlanShards(config, created(p, "Layouts", laid["layouts"]), naming, drops)

    return outputs(build)[0]
