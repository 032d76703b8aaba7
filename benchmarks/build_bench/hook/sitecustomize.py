"""Profiles an encode worker of the job's local pool (`python -m beam_jobs.local.worker`) with cProfile.

bench_build.py --profile puts this folder first on PYTHONPATH and names an output folder in
TPU_SHARDS_BENCH_WORKER_PROFILE; every other process ignores it. Stats go to <folder>/worker-<pid>.prof
when the worker exits (the pool closes its input at the end of the build).
"""
import os
import sys

_folder = os.environ.get("TPU_SHARDS_BENCH_WORKER_PROFILE")
if _folder and "beam_jobs.local.worker" in getattr(sys, "orig_argv", ()):
    import atexit
    import cProfile

    _profile = cProfile.Profile()

    def _dump() -> None:
        _profile.disable()
        _profile.dump_stats(os.path.join(_folder, f"worker-{os.getpid()}.prof"))

    atexit.register(_dump)
    _profile.enable()
