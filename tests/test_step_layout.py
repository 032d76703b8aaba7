"""PlanLayout on its own: real JPEGs listed in chunks in, each item keyed, each split's runs and their exact
boundaries out (or the one line that says why there are none)."""
from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import apache_beam as beam
import pool_helpers
import pytest
from apache_beam.testing.util import assert_that, equal_to
from conftest import write_images
from steps import counters, media_chunks, outputs, pipeline, run, step_config

from beam_jobs.local.pool import LocalPool
from beam_jobs.pipeline.plan_runs import PlanLayout, _pooled, sample_sizes
from shard_utils.format.order import choose_split
from shard_utils.media.encode import encode_item
from shard_utils.sharding.encode_run import item_order, weigh_sample

SPLITS = ("--splits", "train=0.7,validation=0.3")


def planned(config, chunks):
    def build(p):
        out = p | beam.Create(chunks) | PlanLayout(config)
        return {"keyed": out["keyed"], "layouts": out["layouts"], "failure": out["failure"]}

    return outputs(build)


def test_every_item_is_keyed_by_its_split_and_order(tmp_path):
    write_images(tmp_path / "in", {"cat": 6, "dog": 5})
    config = step_config(tmp_path, tmp_path / "in", *SPLITS, "--seed", "3")
    chunks = media_chunks(config)
    p = pipeline()
    out = p | beam.Create(chunks) | PlanLayout(config)
    expected = [(choose_split([("train", 0.7), ("validation", 0.3)], 3, item.source_id), item_order(item, 3),
                 item.source_id) for chunk in chunks for item in chunk]
    assert_that(out["keyed"] | beam.FlatMap(lambda chunk: [(s, o, item.source_id) for s, o, item in chunk]),
                equal_to(expected), label="Keyed")
    assert_that(out["failure"], equal_to([]), label="NoFailure")
    run(p)


def test_each_split_is_cut_into_runs_at_keys_of_its_items(tmp_path):
    write_images(tmp_path / "in", {"cat": 6, "dog": 5})
    (tmp_path / "in" / "dog" / "broken.jpg").write_bytes(b"\xff\xd8 not a whole jpeg")
    config = step_config(tmp_path, tmp_path / "in", *SPLITS)
    out, result = planned(config, media_chunks(config))
    assert out["failure"] == [] and len(out["layouts"]) == 1
    layouts = out["layouts"][0]
    keyed = [entry for chunk in out["keyed"] for entry in chunk]
    assert sorted(layouts) == ["train", "validation"]
    for split, layout in layouts.items():
        orders = sorted(order for s, order, _ in keyed if s == split)
        assert layout.num_listed == len(orders)
        assert len(layout.boundaries) == layout.num_runs - 1 and set(layout.boundaries) <= set(orders)
        assert sorted({layout.run_of(order) for order in orders}) == list(range(layout.num_runs))  # no empty run
    assert counters(result)["sample_encoded"] == 11  # the broken file is left out of the size sample


def test_the_size_sample_weighs_the_records_the_build_writes_with_its_quality_checks(tmp_path):
    write_images(tmp_path / "in", {"cat": 3}, fmt="PNG", ext="png")
    (tmp_path / "in" / "cat" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not a whole png")
    config = step_config(tmp_path, tmp_path / "in", "--jpeg-quality", "75")
    items = [item for chunk in media_chunks(config) for item in chunk]
    settings = config.encode_settings({"cat": 0})
    assert settings.image.inspect  # the build's records come with the checks; the sample is encoded without them
    records = [encode_item(item, settings) for item in items]
    lengths = [r.meta.length for r in records if not isinstance(r, dict)]
    sample = sample_sizes(items, config)
    assert (sample.records, sample.record_bytes) == (3, sum(lengths)) and len(lengths) == 3
    assert sample.source_bytes == sum(item.size for item, r in zip(items, records, strict=True)
                                      if not isinstance(r, dict))


def test_the_size_sample_is_weighed_alike_in_the_local_pool(tmp_path):
    write_images(tmp_path / "in", {"cat": 3, "dog": 2}, fmt="PNG", ext="png")
    (tmp_path / "in" / "dog" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not a whole png")
    config = step_config(tmp_path, tmp_path / "in", "--jpeg-quality", "75")
    items = [item for chunk in media_chunks(config) for item in chunk]
    try:
        pooled = sample_sizes(items, replace(config, workers=2))
        pool = LocalPool.shared(2)
        answered = [w.answered for w in pool._workers.values()]
    finally:
        LocalPool.close_all()
    assert answered == [True, True]  # each worker weighed its part of the sample
    assert pooled == sample_sizes(items, config) and pooled.records == 5


def test_a_sample_part_whose_worker_crashed_is_weighed_in_the_driver(tmp_path, monkeypatch):
    write_images(tmp_path / "in", {"cat": 2, "dog": 2}, fmt="PNG", ext="png")
    (tmp_path / "in" / "dog" / "crash-0.png").write_bytes((tmp_path / "in" / "dog" / "img0000.png").read_bytes())
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("DRIVER_PID", str(os.getpid()))
    config = step_config(tmp_path, tmp_path / "in", "--jpeg-quality", "75")
    items = [item for chunk in media_chunks(config) for item in chunk]
    parts = [[i for i in items if "crash-" not in i.uri], [i for i in items if "crash-" in i.uri]]
    settings = config.encode_settings({"cat": 0, "dog": 1})
    try:
        weighed = _pooled(parts, settings, 2, weigh=pool_helpers.weigh_or_crash)
    finally:
        LocalPool.close_all()
    assert weighed == [weigh_sample(part, settings) for part in parts] and weighed[1][2] == 1


@pytest.mark.slow
def test_the_layout_does_not_depend_on_how_the_listing_was_chunked(tmp_path):
    write_images(tmp_path / "in", {"cat": 9, "dog": 8})
    config = step_config(tmp_path, tmp_path / "in", *SPLITS)
    by_fives, _ = planned(config, media_chunks(config, 5))
    singles, _ = planned(config, list(reversed(media_chunks(config, 1))))
    assert by_fives["layouts"] == singles["layouts"] and len(by_fives["layouts"]) == 1


def test_a_listing_that_cannot_be_laid_out_gives_its_reason_and_no_layout(tmp_path):
    write_images(tmp_path / "in", {"cat": 1})
    config = step_config(tmp_path, tmp_path / "in", "--splits", "train=0.5,validation=0.5")
    out, _ = planned(config, media_chunks(config))
    assert out["layouts"] == [] and len(out["failure"]) == 1
    assert "received no records from --splits" in out["failure"][0]
