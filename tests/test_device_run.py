"""benchmarks/device_run.sh, the lent machine's one bounded run: valid bash, and what it runs exists and takes its
options (a device call that finds a typo costs minutes of a machine); bench_build logs each measurement as it is
made (a run cut short by the machine's time limit keeps them)."""
from __future__ import annotations

import re
import subprocess

from conftest import REPO

from benchmarks import bench_build

SCRIPT = REPO / "benchmarks" / "device_run.sh"


def test_device_run_is_valid_bash_and_runs_only_benchmarks_that_exist():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True, timeout=30)
    named = set(re.findall(r"benchmarks/\w+\.py", SCRIPT.read_text()))
    assert named == {"benchmarks/bench_build.py", "benchmarks/bench_jax.py"}
    assert all((REPO / name).is_file() for name in named)


def test_device_run_build_options_are_accepted_by_bench_build():
    text = SCRIPT.read_text()
    flags = ["--count", "4000", "--workers", "1,2,4,8,16", "--no-tfds", "--big-factor", "0", "--work", "w"]
    assert all(flag in text for flag in flags if flag.startswith("--"))
    args = bench_build.parse_args(flags)
    assert (args.count, args.workers, args.no_tfds, args.big_factor) == (4000, [1, 2, 4, 8, 16], True, 0)


def test_bench_build_logs_each_measurement_as_it_is_made(tmp_path, capsys):
    from build_bench.results import Timing  # on the path bench_build sets up

    bench = bench_build.Bench(bench_build.parse_args(["--work", str(tmp_path)]), 2, [1, 2])
    bench.add(("pillow", 2, 4000), Timing(12.5, 24.25))
    bench.add(("pillow", 2, 4000), Timing(13.0, 23.0))  # a second round: the board keeps the best of each
    logged = capsys.readouterr().err
    assert "  pillow 2 4000: 12.500 s, 24.250 CPU s\n" in logged
    assert "  pillow 2 4000: 13.000 s, 23.000 CPU s\n" in logged
    best = bench.board.get(("pillow", 2, 4000))
    assert (best.seconds, best.cpu) == (12.5, 23.0)
