"""One whole process timed: wall seconds, CPU seconds of it and every process it waited for, and the peak of the
memory of its whole process tree: the proportional set sizes (PSS) of the process and all its descendants, summed,
sampled. PSS shares each page among the processes that map it, so forked workers are not counted once each for
what they share with their parent, as their resident sets would be."""
from __future__ import annotations

import resource
import subprocess
import threading
import time
from dataclasses import dataclass

import psutil

SAMPLE_SECONDS = 0.2  # reading a PSS costs a few ms a process: sampled 5 times a second


@dataclass(frozen=True)
class Run:
    """A finished process: its times, its tree's peak memory, its exit status and the end of what it printed."""

    wall: float
    cpu: float
    peak_mb: float
    returncode: int
    tail: str


def tree_memory(process: psutil.Process) -> int:
    """Bytes of memory of process and its descendants now, PSS where the system gives it, else resident (those
    that end while being read count as 0)."""
    total = 0
    try:
        members = [process, *process.children(recursive=True)]
    except psutil.Error:
        return 0
    for member in members:
        try:
            total += getattr(member.memory_full_info(), "pss", 0) or member.memory_info().rss
        except psutil.Error:
            pass
    return total


def _sample(pid: int, done: threading.Event, peak: list[int]) -> None:
    try:
        process = psutil.Process(pid)
    except psutil.Error:
        return
    while not done.wait(SAMPLE_SECONDS):
        peak[0] = max(peak[0], tree_memory(process))


def timed(cmd: list[str], env: dict[str, str], cwd: str, timeout: float) -> Run:
    """Run cmd to its end (killed after timeout seconds) and measure it. CPU time is read from this process's
    waited-for children, so the benchmark must run nothing else as a child meanwhile."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    process = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    done, peak = threading.Event(), [0]
    sampler = threading.Thread(target=_sample, args=(process.pid, done, peak), daemon=True)
    sampler.start()
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
        output += f"\nkilled after {timeout:.0f} s"
    wall = time.perf_counter() - start
    done.set()
    sampler.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return Run(wall, cpu, peak[0] / 1e6, process.returncode, output[-2000:])
