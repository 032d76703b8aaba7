"""Publish on its own: written shards, plans, rejects and the tally in; the dataset made visible, manifest last.
Published again, or twice at once, the output is the same; a build that cannot publish says why in one line
(locally, through the metric the driver raises) and publishes nothing."""
from __future__ import annotations

import functools
import json
import pickle
import random
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from apache_beam.testing.util import assert_that, equal_to
from conftest import write_images
from readers import records
from steps import (
    counters,
    created,
    encode_inputs,
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
    string_sets,
    twice_at_once,
)

from beam_jobs.pipeline.encode import EncodeRuns
from beam_jobs.pipeline.publish import Publish
from beam_jobs.pipeline.write import WriteShards
from beam_jobs.publish import plan_publication
from beam_jobs.run.config import RejectLimit
from beam_jobs.run.failure import FAILURE_METRIC
from beam_jobs.run.tally import Tally
from shard_utils.format import schema
from shard_utils.format.manifest import load
from shard_utils.read.verify import verify
from shard_utils.storage import lock as runlock


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """12 JPEGs, a broken one and a text file, encoded and written into shards once for the module: every
    input Publish takes, as values."""
    tmp_path = tmp_path_factory.mktemp("publish")
    root = tmp_path / "in"
    write_images(root, {"cat": 7, "dog": 5})
    (root / "dog" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 cut short")
    (root / "dog" / "notes.txt").write_text("not an image")
    config = step_config(tmp_path, root, "--splits", "train=0.75,validation=0.25", "--num-cores", "2")
    chunks = media_chunks(config)
    laid, labels = laid_out(config, chunks), labels_of(chunks)

    def encoded(p):
        keyed, layouts, names, run_ = encode_inputs(p, config, laid, labels)
        out = keyed | EncodeRuns(config, layouts, names, run_)
        return {"runs": out.runs, "rejected": out.rejected}

    enc = outputs(encoded)[0]
    tally = Tally(seen=14)  # 12 records, 1 rejected, 1 skipped: the accounting Publish checks closes
    tally.skip("not_media", ".txt")
    planned = planned_shards(config, laid, enc["runs"])
    shards = outputs(lambda p: {"shards": created(p, "Tasks", planned["tasks"])
                                | WriteShards(config, created(p, "Run", [run_info(config)]))})[0]["shards"]
    return config, {"shards": shards, "plans": planned["plans"], "failure": [], "rejected": enc["rejected"],
                    "skipped_files": [{"source": "dog/notes.txt", "reason": "not_media"}],
                    "tally": [tally], "labels": labels, "cross_split": []}


def fresh(written, tmp_path: Path):
    """(config, inputs) of the same build into an output of this test's own: the shards copied into its run's
    temporary folder, and the output's lock taken for the run, as StartRun's driver does."""
    config, inputs = written
    mine = replace(config, output=str(tmp_path / "out"), temp_root=str(tmp_path / "out" / ".tmp"))
    old, new = run_info(config).temp_dir, run_info(mine).temp_dir
    shutil.copytree(old, new, ignore=shutil.ignore_patterns("runs"))
    shards = [replace(r, temp_path=r.temp_path.replace(old, new), index_part=r.index_part.replace(old, new))
              for r in inputs["shards"]]
    runlock.acquire(mine.output, mine.run_id, mine.created)
    return mine, {**inputs, "shards": shards}


def publish(config, inputs: dict):
    """Run Publish once on these inputs; returns (what it gave, the PipelineResult)."""
    def build(p):
        pcolls = {name: created(p, name.title(), values) for name, values in inputs.items()}
        pcolls["run"] = created(p, "Run", [run_info(config)])
        return {"published": pcolls | Publish(config)}

    return outputs(build)


@pytest.mark.slow
def test_the_dataset_is_published_with_its_reports_and_nothing_left_behind(written, tmp_path):
    config, inputs = fresh(written, tmp_path)
    out, result = publish(config, inputs)
    output = Path(config.output)
    assert out["published"] == [str(output / "manifest.json")]
    assert verify(str(output), deep=True) == []
    m = load(str(output))
    assert sorted(s.path for split in m.splits.values() for s in split.shards) == \
        sorted(r.name for r in inputs["shards"])
    stored = sorted(r[schema.SOURCE_ID].decode() for split in m.splits.values() for s in split.shards
                    for r in records(output / s.path))
    assert len(stored) == 12 and m.files_seen == 14 and m.rejected["count"] == 1 and m.skipped["count"] == 1
    assert [line for line in (output / "rejected.jsonl").read_text().splitlines() if "dog/broken.jpg" in line]
    assert not (output / ".tmp").exists() and not runlock.holds(config.output, config.run_id)
    assert counters(result)["shards_published"] == len(inputs["shards"])


@pytest.mark.slow  # two whole Publish pipelines: over the fast subset's 3 CPU-s
def test_publishing_again_changes_nothing(written, tmp_path):
    config, inputs = fresh(written, tmp_path)
    first, _ = publish(config, inputs)
    files = files_under(Path(config.output))
    assert publish(config, inputs)[0] == first
    assert files_under(Path(config.output)) == files


@pytest.mark.slow
def test_publishing_twice_at_once_publishes_one_dataset(written, tmp_path):
    config, inputs = fresh(written, tmp_path)
    both = twice_at_once(lambda: publish(config, inputs)[0])
    assert both[0] == both[1] == {"published": [str(Path(config.output) / "manifest.json")]}
    assert verify(config.output, deep=True) == []
    alone, alone_inputs = fresh(written, tmp_path / "alone")
    publish(alone, alone_inputs)
    assert files_under(Path(config.output)) == files_under(Path(alone.output))


def test_a_build_that_cannot_publish_says_why_and_publishes_nothing(written, tmp_path):
    config, inputs = fresh(written, tmp_path)
    p = pipeline()
    pcolls = {name: created(p, name.title(), values) for name, values in {**inputs, "failure": ["no luck"]}.items()}
    pcolls["run"] = created(p, "Run", [run_info(config)])
    assert_that(pcolls | Publish(config), equal_to([]))
    why = string_sets(run(p))[FAILURE_METRIC]
    assert len(why) == 1 and next(iter(why)).startswith("PlanError: no luck")
    assert not (Path(config.output) / "manifest.json").exists()
    assert (Path(run_info(config).temp_dir) / "report" / "rejected.jsonl").is_file()  # why, file by file


def test_too_many_rejects_publish_nothing(written, tmp_path):
    config, inputs = fresh(written, tmp_path)
    strict = replace(config, max_rejected=replace(config.max_rejected, count=0, fraction=None))
    p = pipeline()
    pcolls = {name: created(p, name.title(), values) for name, values in inputs.items()}
    pcolls["run"] = created(p, "Run", [run_info(config)])
    assert_that(pcolls | Publish(strict), equal_to([]))
    why = next(iter(string_sets(run(p))[FAILURE_METRIC]))
    assert "1 of 14 files were rejected, more than --max-rejected 0 allows" in why
    assert not (Path(config.output) / "manifest.json").exists()


def measured_plan(results, config, *, record: str, **kw):
    """plan_publication, after writing down how big the reports that reached the one key were when pickled."""
    Path(record).write_text(json.dumps({name: [len(pickle.dumps(kw[name])), len(kw[name].pieces)]
                                        for name in ("rejected", "skipped_files")}))
    return plan_publication(results, config, **kw)


@pytest.mark.slow
def test_many_rejects_make_the_one_sorted_report_and_only_their_counts_reach_the_one_key(written, tmp_path):
    config, inputs = fresh(written, tmp_path)
    config = replace(config, max_rejected=RejectLimit(fraction=1.0))
    rng = random.Random(5)
    many = [{"source": f"gone/{rng.randrange(10**6):06d}-{i}.jpg", "reason": rng.choice(("corrupt", "too_small")),
             "message": "simulated"} for i in range(2000)]
    tally = Tally(seen=14 + len(many))
    tally.skip("not_media", ".txt")
    batched = many[:1000] + [tuple(many[i:i + 50]) for i in range(1000, 2000, 50)]  # a run's entries: one element
    given = {**inputs, "rejected": list(inputs["rejected"]) + batched, "tally": [tally]}
    inputs = {**inputs, "rejected": list(inputs["rejected"]) + many, "tally": [tally]}
    record = tmp_path / "joined.json"

    def build(p):
        pcolls = {name: created(p, name.title(), values) for name, values in given.items()}
        pcolls["run"] = created(p, "Run", [run_info(config)])
        planner = functools.partial(measured_plan, record=str(record))
        return {"published": pcolls | Publish(config, planner=planner, piece_lines=300)}

    outputs(build)
    lines = sorted(inputs["rejected"], key=lambda e: (e["source"], e["reason"], json.dumps(e, ensure_ascii=False)))
    assert (Path(config.output) / "rejected.jsonl").read_bytes() == "".join(
        json.dumps(e, ensure_ascii=False) + "\n" for e in lines).encode()  # the bytes of one sort, as before
    assert load(config.output).rejected["count"] == 2001 and verify(config.output) == []
    (size, pieces), _ = json.loads(record.read_text()).values()
    assert pieces >= 5 and size < 2_000 and 30 * size < len(pickle.dumps(inputs["rejected"]))  # not 2,001 dicts
