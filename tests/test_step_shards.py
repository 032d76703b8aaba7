"""PlanShards and WriteShards on their own: encoded runs in, exact shard plans and tasks out; tasks in, shards
and their index parts written under the run's temporary folder, the same when written again or twice at once."""
from __future__ import annotations

import hashlib
import shutil
from dataclasses import replace
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to
from conftest import write_images
from readers import records
from steps import (
    counters,
    created,
    encoded_runs,
    files_under,
    labels_of,
    laid_out,
    media_chunks,
    outputs,
    pipeline,
    planned_shards,
    run,
    run_info,
    step_config,
    twice_at_once,
)

from beam_jobs.pipeline.shards import PlanShards
from beam_jobs.pipeline.write import WriteShards
from shard_utils.format import schema
from shard_utils.sharding.naming import ShardNaming


@pytest.fixture(scope="module")
def encoded(tmp_path_factory):
    """20 JPEGs and a broken one in two splits, laid out and encoded into runs once for the module."""
    tmp_path = tmp_path_factory.mktemp("shards")
    write_images(tmp_path / "in", {"cat": 11, "dog": 9})
    (tmp_path / "in" / "dog" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 cut short")
    config = step_config(tmp_path, tmp_path / "in", "--splits", "train=0.7,validation=0.3", "--num-cores", "2")
    chunks = media_chunks(config)
    laid = laid_out(config, chunks)
    return config, laid, encoded_runs(config, laid, labels_of(chunks))


@pytest.fixture
def planned(encoded, request):
    """The module's shard tasks, with a copy of its runs in a temporary folder of this test's own run."""
    config, laid, runs = encoded
    tasks = planned_shards(config, laid, runs)["tasks"]
    return moved(config, tasks, request.node.name[:40])


def moved(config, tasks, run_id: str):
    """(config, tasks) of another run of the same build: the runs copied into its temporary folder."""
    mine = replace(config, run_id=run_id)
    old, new = run_info(config).temp_dir, run_info(mine).temp_dir
    shutil.copytree(Path(old) / "runs", Path(new) / "runs")

    def there(run_file):
        return replace(run_file, parts=tuple((p.replace(old, new), n) for p, n in run_file.parts),
                       meta_path=run_file.meta_path.replace(old, new))

    return mine, [replace(t, runs={n: there(r) for n, r in t.runs.items()}) for t in tasks]


def sources_of(runs, split: str) -> list[str]:
    return sorted(e.meta.source_id for r in runs if r.split == split and r.file for e in r.file.entries())


@pytest.mark.slow
def test_each_split_gets_balanced_shards_covering_every_record_once(encoded):
    config, laid, runs = encoded
    out = planned_shards(config, laid, runs)
    assert out["failure"] == [] and len(out["plans"]) == 1
    plans, tasks = out["plans"][0], out["tasks"]
    assert sorted(plans) == ["train", "validation"]
    for split, plan in plans.items():
        assert max(plan.sizes) - min(plan.sizes) <= 1 and min(plan.sizes) > 0 and plan.num_shards % 2 == 0
        assert plan.num_records == sum(plan.sizes) == len(sources_of(runs, split))
        mine = sorted((t for t in tasks if t.plan.split == split), key=lambda t: t.plan.shard)
        assert [t.plan for t in mine] == list(plan.shards)
        assert [t.name for t in mine] == [f"{split}-{i:05d}-of-{plan.num_shards:05d}.tfrecord"
                                          for i in range(plan.num_shards)]
        taken = sorted((p.run, p.first + i) for t in mine for p in t.plan.pieces for i in range(p.count))
        assert len(taken) == len(set(taken)) == plan.num_records  # no record twice, none left out


def test_dropped_records_are_left_out_of_the_shards(encoded):
    config, laid, runs = encoded
    victim = next(r for r in runs if r.split == "train" and r.file and r.file.count)
    out = planned_shards(config, laid, runs, dropped=[("train", victim.run, 0)])
    plans = out["plans"][0]
    assert plans["train"].num_records == len(sources_of(runs, "train")) - 1
    assert [t.dropped for t in out["tasks"] if victim.run in t.dropped] == [{victim.run: frozenset({0})}]


@pytest.mark.slow
def test_shards_that_cannot_be_made_give_the_reason_and_no_task(encoded):
    config, laid, runs = encoded
    p = pipeline()
    naming = ShardNaming.for_build(config.shard_extension)
    out = created(p, "Runs", runs) | PlanShards(replace(config, num_shards=64), created(p, "Layouts", laid["layouts"]),
                                                naming)
    assert_that(out["tasks"], equal_to([]), label="NoTasks")
    assert_that(out["plans"], equal_to([]), label="NoPlans")
    assert_that(out["failure"] | beam.Map(lambda why: "--num-shards 64 is more than" in why), equal_to([True]),
                label="Failure")
    run(p)
    nothing = [replace(r, file=None) for r in runs]
    assert planned_shards(config, laid, nothing)["failure"] == ["no input file could be used (0 records)"]


def runs_sources(runs) -> list[str]:
    return sources_of(runs, "train") + sources_of(runs, "validation")


def write(config, tasks):
    """Run WriteShards once; returns (its results, sorted by name, the counters)."""
    def build(p):
        return {"shards": created(p, "Tasks", tasks) | WriteShards(config, created(p, "Run", [run_info(config)]))}

    out, result = outputs(build)
    return sorted(out["shards"], key=lambda r: r.name), counters(result)


def test_every_shard_is_written_with_its_planned_records(encoded, planned):
    runs = encoded[2]
    config, tasks = planned
    assert {t.plan.prefix for t in tasks} == {True, False}  # shards taken from runs, and shards copied
    results, found = write(config, tasks)
    assert [r.name for r in results] == sorted(t.name for t in tasks)
    for result in results:
        data = Path(result.temp_path).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (result.num_bytes, result.sha256)
        assert len(records(Path(result.temp_path))) == result.num_records and Path(result.index_part).is_file()
    for split in ("train", "validation"):
        stored = sorted(r[schema.SOURCE_ID].decode() for res in results if res.split == split
                        for r in records(Path(res.temp_path)))
        assert stored == sources_of(runs, split)
    assert found["shards_written"] == len(tasks) and found["images_written"] == 20 == len(runs_sources(runs))
    assert found["bytes_written"] == sum(r.num_bytes for r in results)


@pytest.mark.slow
def test_each_part_of_the_step_and_the_whole_step_written_again_give_the_same_shards(planned):
    """Copies, then the whole step (the copies again, then the prefixes), then the prefixes again, then the whole
    step once more: what a retry of each of the step's parts, or of the whole step, does. Taking a prefix moves
    a run's file and cuts it; the copies run again read the tail saved beside it."""
    config, tasks = planned
    copies = [t for t in tasks if not t.plan.prefix]
    prefixes = [t for t in tasks if t.plan.prefix]
    temp = Path(run_info(config).temp_dir)
    copied, _ = write(config, copies)
    everything, _ = write(config, tasks)
    files = shard_files(temp)
    assert [r for r in everything if r.name in {t.name for t in copies}] == copied
    assert write(config, prefixes)[0] == [r for r in everything if r.name in {t.name for t in prefixes}]
    assert write(config, tasks)[0] == everything
    assert shard_files(temp) == files and len(files) == 2 * len(tasks)  # each shard and its index part


@pytest.mark.slow
def test_the_whole_step_twice_at_once_gives_the_shards_of_one_write(encoded, planned, request):
    """Two WriteShards over the same tasks at the same time (one may take a prefix while the other copies from
    that run): the shards and index parts of one write of the step."""
    config, tasks = planned
    both = twice_at_once(lambda: write(config, tasks)[0])
    assert both[0] == both[1]
    once, once_tasks = moved(encoded[0], planned_shards(*encoded)["tasks"], request.node.name[:40] + "-once")
    alone, _ = write(once, once_tasks)
    assert without_paths(both[0]) == without_paths(alone)
    assert shard_files(Path(run_info(config).temp_dir)) == shard_files(Path(run_info(once).temp_dir))


def shard_files(temp: Path) -> dict[str, bytes]:
    """The shards and index parts under a run's temporary folder (not its runs, which taking a prefix moves)."""
    return {name: data for name, data in files_under(temp).items() if not name.startswith("runs/")}


def without_paths(results: list) -> list:
    return sorted((replace(r, temp_path="", index_part="") for r in results), key=lambda r: r.name)
