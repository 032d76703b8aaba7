"""EncodeRuns on its own: keyed items and their layout in, one run file per run (records in key order) and the
rejects out; run again, or twice at once, it writes the same runs."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to
from conftest import write_images
from steps import (
    counters,
    encode_inputs,
    files_under,
    labels_of,
    laid_out,
    media_chunks,
    outputs,
    pipeline,
    run,
    run_info,
    step_config,
    twice_at_once,
)

from beam_jobs.pipeline.encode import EncodeRuns


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """9 JPEGs and a broken one, laid out (PlanLayout run once for the module)."""
    tmp_path = tmp_path_factory.mktemp("encode")
    write_images(tmp_path / "in", {"cat": 5, "dog": 4})
    (tmp_path / "in" / "dog" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 cut short")
    config = step_config(tmp_path, tmp_path / "in", "--splits", "train=0.6,validation=0.4", "--num-cores", "2",
                         "--num-shards", "2")  # runs of several records each
    chunks = media_chunks(config)
    return config, laid_out(config, chunks), labels_of(chunks)


def dataset(planned, request):
    """The planned dataset with a run of its own (its own temporary folder) for this test."""
    config, laid, labels = planned
    return replace(config, run_id=request.node.name[:40]), laid, labels


def describe(encoded):
    """An EncodedRun as plain values: split, run, records, and each record's (order, label ids) in run order
    (typed Any where it is used: see steps.created)."""
    entries = encoded.file.entries() if encoded.file is not None else []
    return (encoded.split, encoded.run, encoded.tally.records, tuple((e.meta.order, e.meta.labels) for e in entries))


def encode(config, laid, labels, known=()):
    """Run EncodeRuns once; returns (its runs described, its rejects, the counters)."""
    def build(p):
        keyed, layouts, names, run_ = encode_inputs(p, config, laid, labels)
        out = keyed | EncodeRuns(config, layouts, names, run_, known_labels=known)
        return {"runs": out.runs | beam.Map(describe).with_output_types(Any), "rejected": out.rejected}

    out, result = outputs(build)
    return sorted(out["runs"]), out["rejected"], counters(result)


def test_each_run_holds_its_items_in_key_order_and_a_broken_file_is_rejected(planned, request):
    config, laid, labels = dataset(planned, request)
    runs, rejects, found = encode(config, laid, labels)
    layouts = laid["layouts"][0]
    keyed = {item.source_id: (split, order) for chunk in laid["keyed"] for split, order, item in chunk}
    assert [(split, run) for split, run, _, _ in runs] == [(s, r) for s in sorted(layouts)
                                                           for r in range(layouts[s].num_runs)]
    assert max(records for _, _, records, _ in runs) >= 3  # an order within runs to check
    for split, run_, records, entries in runs:
        orders = [order for order, _ in entries]
        assert records == len(entries) and orders == sorted(orders)
        assert all(keyed[source] == (split, (key, source)) and layouts[split].run_of((key, source)) == run_
                   for (key, source), _ in entries)
    stored = {order[1]: ids for *_, entries in runs for order, ids in entries}
    assert stored == {source: ((0,) if source.startswith("cat/") else (1,))
                      for source in keyed if source != "dog/broken.jpg"}
    assert [(r["source"], r["reason"]) for r in rejects] == [("dog/broken.jpg", "corrupt")]
    assert found["runs_encoded"] == len(runs) and found["rejected_corrupt"] == 1
    assert found["images_reencoded"] + found.get("images_passed_through", 0) == 9


def test_rejects_leave_through_the_tagged_output(planned, request):
    config, laid, labels = dataset(planned, request)
    p = pipeline()
    keyed, layouts, names, run_ = encode_inputs(p, config, laid, labels)
    out = keyed | EncodeRuns(config, layouts, names, run_)
    assert_that(out.rejected | beam.Map(lambda r: (r["source"], r["reason"])),
                equal_to([("dog/broken.jpg", "corrupt")]))
    run(p)


def test_the_dataset_labels_keep_their_ids(planned, request):
    config, laid, labels = dataset(planned, request)
    runs, _, _ = encode(config, laid, labels, known=("dog",))
    stored = {order[1]: ids for *_, entries in runs for order, ids in entries}
    assert {ids for source, ids in stored.items() if source.startswith("dog/")} == {(0,)}
    assert {ids for source, ids in stored.items() if source.startswith("cat/")} == {(1,)}


@pytest.mark.slow
def test_encoding_again_or_twice_at_once_writes_the_same_runs(planned, request):
    config, laid, labels = dataset(planned, request)
    temp = Path(run_info(config).temp_dir)
    first = encode(config, laid, labels)[:2]
    files = files_under(temp)
    assert sum(name.startswith("runs/") for name in files) == 2 * sum(1 for r in first[0] if r[2])  # data, metadata
    assert encode(config, laid, labels)[:2] == first and files_under(temp) == files
    both = twice_at_once(lambda: encode(config, laid, labels)[:2])
    assert both == [first, first] and files_under(temp) == files
