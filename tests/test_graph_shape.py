"""One graph for every runner: a local build, a Dataflow job and a template launch run the same steps."""
from __future__ import annotations

import apache_beam as beam
import pytest
from conftest import write_images

from beam_jobs.jobs import options
from beam_jobs.jobs.build import build_pipeline
from beam_jobs.jobs.checks import prepare_inputs


def steps_of_graph(tmp_path, *, local: bool, workers: int, template: bool = False) -> set[str]:
    """Every transform's full label in the build's graph for a runner."""
    src = tmp_path / "in"
    if not src.exists():
        write_images(src, {"a": 2})
    args, _ = options.parse(["--input", str(src), "--output", str(tmp_path / "out")])
    listing, split_dirs = prepare_inputs(args)
    config = options.make_config(args, split_dirs, workers=workers, temp_root=str(tmp_path / "tmp"),
                                 run_id=None if template else "r", created=None if template else "",
                                 listing=listing, local=local)
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


@pytest.mark.slow
def test_a_local_build_runs_the_graph_dataflow_runs(tmp_path):
    local = steps_of_graph(tmp_path, local=True, workers=2)
    dataflow = steps_of_graph(tmp_path, local=False, workers=1)
    assert local == dataflow
    assert {"ListMedia/List1", "ShardMedia/PlanLayout", "ShardMedia/EncodeRuns", "ShardMedia/PlanShards",
            "ShardMedia/WriteShards", "Publish/Move", "Publish/MergeIndex", "Publish/Commit"} <= local


@pytest.mark.slow
def test_a_template_launch_adds_only_the_steps_that_stand_in_for_a_driver(tmp_path):
    driven = steps_of_graph(tmp_path, local=False, workers=1)
    launched = steps_of_graph(tmp_path, local=False, workers=1, template=True)
    assert {step.split("/")[0] for step in launched - driven} == {"StartRun"}
    assert {"StartRun/Stable", "StartRun/TakeLock", "StartRun/KeepLease"} <= launched
    assert {step for step in driven - launched if step.count("/") == 1} == {"StartRun/Decided"}


@pytest.mark.parametrize("readme_name", ["StartRun", "ListMedia", "PlanLayout", "EncodeRuns", "FindNearDuplicates",
                                         "PlanShards", "WriteShards", "Publish"])
def test_the_steps_the_guide_names_are_in_the_graph(tmp_path, readme_name):
    """The guide's step names (docs/dataflow.md) are the graph's own."""
    from pathlib import Path

    guide = (Path(__file__).resolve().parent.parent / "docs" / "dataflow.md").read_text()
    assert f"`{readme_name}`" in guide
    write_images(tmp_path / "in", {"a": 2})
    args, _ = options.parse(["--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--dedup"])
    listing, split_dirs = prepare_inputs(args)
    config = options.make_config(args, split_dirs, workers=1, temp_root=str(tmp_path / "tmp"), run_id="r",
                                 created="", listing=listing, local=False)
    p = beam.Pipeline(runner="FnApiRunner")
    build_pipeline(p, config)
    names = set()

    class Visitor(beam.pipeline.PipelineVisitor):
        def enter_composite_transform(self, node):
            names.add(node.full_label.rsplit("/", 1)[-1])

        def visit_transform(self, node):
            names.add(node.full_label.rsplit("/", 1)[-1])

    p.visit(Visitor())
    assert readme_name in names
