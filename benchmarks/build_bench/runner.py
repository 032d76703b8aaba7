"""Timed child processes: the job and the TFDS builder each run in a fresh Python that imports first, then
times itself; this side polls the peak resident memory of the child's whole process tree."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"
HOOK = Path(__file__).resolve().parent / "hook"
POLL_SECONDS = 0.1
PAGE = os.sysconf("SC_PAGE_SIZE")


def _children(pid: int) -> list[int]:
    """The direct children of a process, from /proc/<pid>/task/*/children (no scan of every process)."""
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:  # the process or thread just ended
        pass
    return out


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def tree_rss(pid: int) -> tuple[int, int]:
    """(summed RSS in bytes, number of processes) of a process and all its descendants.

    A child caught between fork and exec (its command line still its parent's) is left out: for those
    few milliseconds its RSS counts the parent's pages again (a worker being started showed the
    driver's 205 MB), which no memory is."""
    total, count, todo = 0, 0, [(pid, None)]
    while todo:
        current, parent_cmdline = todo.pop()
        cmdline = _cmdline(current)
        if parent_cmdline is not None and cmdline == parent_cmdline:
            continue
        total += _rss(current)
        count += 1
        todo += [(child, cmdline) for child in _children(current)]
    return total, count


class TreeMemory:
    """Polls the summed RSS of a process and all its descendants every 0.1 s; `peak_mb` is the largest sum.

    Reads /proc directly: a psutil scan of every process on the machine cost this benchmark ~20% of a
    core, which a 2-core machine would take from the job it measures."""

    def __init__(self, pid: int):
        self.pid = pid
        self.peak = 0
        self.most_processes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="tree-memory")

    def _loop(self) -> None:
        while not self._stop.is_set():
            total, count = tree_rss(self.pid)
            self.peak = max(self.peak, total)
            self.most_processes = max(self.most_processes, count)
            self._stop.wait(POLL_SECONDS)

    def __enter__(self) -> TreeMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def peak_mb(self) -> float:
        return self.peak / 2**20


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a child: this checkout's code first (then the benchmark package), quiet TensorFlow."""
    path = [str(REPO), str(BENCH)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path), "TF_CPP_MIN_LOG_LEVEL": "3",
            "PYTHONHASHSEED": "0", **(extra or {})}


def run_child(module: str, args: list[str], log: Path, env: dict[str, str] | None = None) -> dict:
    """Run `python -m module RESULT.json args...`; returns the JSON it wrote plus peak_tree_mb and processes."""
    log.parent.mkdir(parents=True, exist_ok=True)
    result_path = log.with_suffix(".json")
    result_path.unlink(missing_ok=True)
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", module, str(result_path), *args], cwd=REPO, stdout=out,
                                stderr=subprocess.STDOUT, env=child_env(env))
        with TreeMemory(proc.pid) as memory:
            code = proc.wait()
    if code or not result_path.exists():
        tail = log.read_text(errors="replace")[-3000:]
        raise SystemExit(f"{module} {' '.join(args)} failed (exit {code}); last output ({log}):\n{tail}")
    result = json.loads(result_path.read_text())
    result.update(peak_tree_mb=memory.peak_mb, processes=memory.most_processes)
    return result


class Runs:
    """Runs the job and the TFDS builder as timed children, with logs and outputs under one work folder."""

    def __init__(self, work: Path):
        self.work = work
        self.logs = work / "logs"

    def job(self, label: str, source: Path, workers: int, *flags: str, profile: Path | None = None) -> dict:
        """One build of `source` with `--workers workers` (output removed afterwards)."""
        output = self.work / "out" / label
        args = ["--input", str(source), "--output", str(output), "--overwrite", "--no-progress",
                "--workers", str(workers), *flags]
        env = None
        if profile is not None:
            shutil.rmtree(profile, ignore_errors=True)
            profile.mkdir(parents=True)
            hooked = os.pathsep.join([str(HOOK), str(REPO), str(BENCH)])
            env = {"TPU_SHARDS_BENCH_WORKER_PROFILE": str(profile), "PYTHONPATH": hooked}
            args = ["--profile", str(profile), "--", *args]
        else:
            args = ["--", *args]
        try:
            return run_child("build_bench.job_child", args, self.logs / f"job-{label}.log", env)
        finally:
            shutil.rmtree(output, ignore_errors=True)

    def tfds(self, label: str, kind: str, source: Path, check: bool = False) -> dict:
        """One TFDS download_and_prepare of `source` (kind jpeg or png), or with check=True its verification."""
        data_dir = self.work / "tfds" / label
        shutil.rmtree(data_dir, ignore_errors=True)
        try:
            args = [kind, str(source), str(data_dir), *(["--check"] if check else [])]
            return run_child("build_bench.tfds_child", args, self.logs / f"tfds-{label}.log")
        finally:
            shutil.rmtree(data_dir, ignore_errors=True)
