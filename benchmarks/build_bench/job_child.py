"""Run the build job in this process and time it, Beam and the job's modules imported before the clock.

    python -m build_bench.job_child RESULT.json [--profile DIR] -- JOB ARGS...

Writes {"seconds", "cpu_seconds", "driver_cpu_seconds", "driver_peak_mb"} to RESULT.json (CPU: this process
and its encode workers, which the job has reaped when run() returns; driver CPU: this process alone). With --profile,
every thread of this process runs under cProfile: the main thread's stats go to DIR/driver.prof, the other threads' to
DIR/threads.prof (encode workers profile themselves: see hook/).
"""
from __future__ import annotations

import cProfile
import json
import resource
import sys
import threading
import time

import apache_beam  # noqa: F401 - imported before the clock starts

import beam_jobs.pipeline.dataset  # noqa: F401 - the steps, imported before the clock
from beam_jobs.jobs import build as build_shards


def cpu_seconds() -> float:
    """CPU time (user + system) of this process and of its children that have exited."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def peak_rss_mb() -> float:
    """This process's own peak RSS (VmHWM: unlike ru_maxrss it does not carry over a parent's size)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM"):
                return int(line.split()[1]) / 1024
    return 0.0


class ThreadProfiles:
    """cProfile in the main thread and in every thread started while active (Beam runs steps in threads)."""

    def __init__(self) -> None:
        self.profiles: list[cProfile.Profile] = []
        self._original = threading.Thread.run

    def __enter__(self) -> ThreadProfiles:
        profiles, original = self.profiles, self._original

        def run(thread: threading.Thread) -> None:
            profile = cProfile.Profile()
            profiles.append(profile)
            profile.enable()
            try:
                original(thread)
            finally:
                profile.disable()

        threading.Thread.run = run
        self.main = cProfile.Profile()
        self.main.enable()
        return self

    def __exit__(self, *exc) -> None:
        self.main.disable()
        threading.Thread.run = self._original

    def dump(self, folder: str) -> None:
        """The main thread (where Beam's in-process runner runs every step) to driver.prof; the other
        threads (lease renewal, the pool's pipe readers: mostly blocked) merged into threads.prof."""
        import pstats

        self.main.dump_stats(f"{folder}/driver.prof")
        merged = None
        for profile in self.profiles:
            try:
                merged = pstats.Stats(profile) if merged is None else merged.add(profile)
            except TypeError:  # a thread that never ran a profiled call
                pass
        if merged is not None:
            merged.dump_stats(f"{folder}/threads.prof")


def main(argv: list[str]) -> None:
    result_path, rest = argv[0], argv[1:]
    profile_dir = None
    if rest[:1] == ["--profile"]:
        profile_dir, rest = rest[1], rest[2:]
    if rest[:1] == ["--"]:
        rest = rest[1:]
    out: dict = {}
    cpu, driver_cpu = cpu_seconds(), time.process_time()
    if profile_dir:
        with ThreadProfiles() as profiles:
            start = time.perf_counter()
            build_shards.run(rest)
            out["seconds"] = time.perf_counter() - start
        profiles.dump(profile_dir)
    else:
        start = time.perf_counter()
        build_shards.run(rest)
        out["seconds"] = time.perf_counter() - start
    out["cpu_seconds"] = cpu_seconds() - cpu
    out["driver_cpu_seconds"] = time.process_time() - driver_cpu
    out["driver_peak_mb"] = peak_rss_mb()
    with open(result_path, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main(sys.argv[1:])
