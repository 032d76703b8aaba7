"""Run the build job in this process and time each of its steps: the seconds Beam's in-process runner spends
running the bundles of each fused stage, summed by the step that names the stage.

    python -m build_bench.steps_child RESULT.json -- JOB ARGS...

Writes {step: seconds} to RESULT.json, with "total" (the job's wall time) and "outside bundles" (building and
checking the graph, starting the runner, waiting between stages). A stage is named by the first step in it
that is not a reshuffle, join or the runner's own read and write (e.g. "ShardMedia/EncodeRuns").
Measures by wrapping the runner's private FnApiRunner._execute_bundle: a benchmark's seam, not the job's.
With STEPS_CLOCK=cpu in the environment every figure is the main thread's CPU seconds instead (the driver's own
work, not the encode workers' nor the waits for them; steadier than wall time on a shared machine).
"""
from __future__ import annotations

import collections
import json
import os
import re
import sys
import time

from apache_beam.runners.portability.fn_api_runner import fn_runner

try:
    from beam_jobs.jobs import build as build_job
except ImportError:  # a revision from before the job moved into beam_jobs/jobs
    from beam_jobs import build_shards as build_job

_STEP = re.compile(r"ref_AppliedPTransform_([A-Za-z0-9]+)-([A-Za-z0-9]+)|\(*([A-Za-z0-9]+)/([A-Za-z0-9]+)")


def step_of(stage_name: str) -> str:
    """'Outer/Inner' of the first step a fused stage's name mentions."""
    found = _STEP.search(stage_name)
    if found is None:
        return stage_name[:40]
    outer, inner = (found.group(1), found.group(2)) if found.group(1) else (found.group(3), found.group(4))
    return f"{outer}/{inner}"


CLOCK = time.thread_time if os.environ.get("STEPS_CLOCK") == "cpu" else time.perf_counter


def main(argv: list[str]) -> None:
    result_path, rest = argv[0], argv[1:]
    if rest[:1] == ["--"]:
        rest = rest[1:]
    seconds: dict[str, float] = collections.defaultdict(float)
    original = fn_runner.FnApiRunner._execute_bundle

    def timed(self, context, bundle_manager, bundle_input):
        start = CLOCK()
        try:
            return original(self, context, bundle_manager, bundle_input)
        finally:
            seconds[step_of(bundle_manager.stage.name)] += CLOCK() - start

    fn_runner.FnApiRunner._execute_bundle = timed
    start = CLOCK()
    build_job.run(rest)
    total = CLOCK() - start
    out = dict(seconds)
    out["outside bundles"] = total - sum(seconds.values())
    out["total"] = total
    with open(result_path, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main(sys.argv[1:])
