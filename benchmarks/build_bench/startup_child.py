"""A whole `tpu-shards build` process that notes when each phase of its start-up begins (for bench_startup.py).

    python -m build_bench.startup_child MARKS.json [--profile FILE] -- BUILD ARGS...

The parent puts its clock reading from just before the process was started in STARTUP_T0; MARKS.json gets the
seconds from then to each phase: imports done, graph construction begun and done, the run begun (Beam translates
and optimises the graph first), the steps begun and done, the command done. With --profile, cProfile covers
the command (not the imports) and its stats go to FILE.
"""
from __future__ import annotations

import cProfile
import json
import os
import sys
import time

T0 = float(os.environ["STARTUP_T0"])
MARKS = {"interpreter up": time.time() - T0}

from apache_beam.pipeline import Pipeline  # noqa: E402
from apache_beam.runners.portability.fn_api_runner import fn_runner  # noqa: E402

from beam_jobs import cli  # noqa: E402
from beam_jobs.jobs import build  # noqa: E402
from beam_jobs.local.pool import LocalPool  # noqa: E402


def noted(owner, name: str, start: str, end: str | None = None) -> None:
    """Wrap owner.name so that a call notes `start` (the first call) and `end` (when the last call returns)."""
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        MARKS.setdefault(start, time.time() - T0)
        try:
            return original(*args, **kwargs)
        finally:
            if end:
                MARKS[end] = time.time() - T0

    setattr(owner, name, wrapper)


def main() -> int:
    marks_file, rest = sys.argv[1], sys.argv[2:]
    profile_file = None
    if rest[0] == "--profile":
        profile_file, rest = rest[1], rest[2:]
    argv = ["build", *rest[rest.index("--") + 1:]]
    MARKS["imports done"] = time.time() - T0
    noted(build, "build_pipeline", "graph begun", "graph built")
    noted(Pipeline, "run", "run begun")
    noted(fn_runner.FnApiRunner, "run_stages", "steps begun", "steps done")
    original_shared = LocalPool.shared.__func__

    def shared(cls, workers, *args, **kwargs):
        MARKS.setdefault("pool start begun", time.time() - T0)
        pool = original_shared(cls, workers, *args, **kwargs)
        MARKS.setdefault("pool start returned", time.time() - T0)
        return pool

    LocalPool.shared = classmethod(shared)
    profile = cProfile.Profile() if profile_file else None
    if profile:
        profile.enable()
    code = cli.main(argv)
    if profile:
        profile.disable()
        profile.dump_stats(profile_file)
    MARKS["command done"] = time.time() - T0
    with open(marks_file, "w") as f:
        json.dump(MARKS, f)
    return code


if __name__ == "__main__":
    sys.stdout.flush()
    os._exit(main())  # as the CLI does: no interpreter teardown waiting on Beam's threads
