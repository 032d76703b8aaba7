"""The job's graph differs between runners only where it should: how the listing is spread and labelled."""
from __future__ import annotations

import apache_beam as beam
import pytest
from conftest import write_images

from beam_jobs import options
from beam_jobs.build_shards import build_pipeline, prepare_inputs


def labels_of_graph(tmp_path, local: bool) -> set[str]:
    write_images(tmp_path / "in", {"a": 2})
    args, _ = options.parse(["--input", str(tmp_path / "in"), "--output", str(tmp_path / "out")])
    listing, split_dirs = prepare_inputs(args)
    config = options.make_config(args, split_dirs, workers=2 if local else 1, temp_root=str(tmp_path / "tmp"),
                                 run_id="r", created="", listing=listing, local=local)
    p = beam.Pipeline(runner="FnApiRunner")
    build_pipeline(p, config)
    seen: set[str] = set()

    class Visitor(beam.pipeline.PipelineVisitor):
        def enter_composite_transform(self, node):
            seen.add(node.full_label)

        def visit_transform(self, node):
            seen.add(node.full_label)

    p.visit(Visitor())
    return seen


@pytest.mark.parametrize("local", [True, False])
def test_the_listing_streams_locally_and_is_reshuffled_on_dataflow(tmp_path, local):
    graph = labels_of_graph(tmp_path, local)
    assert ("ListMedia/Spread" in graph) is not local  # Dataflow spreads the walk's chunks over its workers
    assert ("ListMedia/WalkForLabels" in graph) is local  # locally a second walk names the labels, so the
    assert ("ListMedia/DistinctLabels" in graph) is not local  # media need not wait in memory for them
