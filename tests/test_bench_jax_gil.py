"""benchmarks/bench_jax_gil.py runs end to end at a tiny size (both trees, every part, the ratios), so it cannot rot."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from conftest import REPO


@pytest.mark.jax
@pytest.mark.slow
def test_bench_jax_gil_times_both_trees_at_a_tiny_size(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_jax_gil.py"), "--data", str(tmp_path), "--images", "16",
         "--source-size", "48", "--resize", "24", "--batch", "4", "--batches", "2", "--rounds", "2",
         "--against", "HEAD"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    out = proc.stdout
    assert "16 48x48 JPEGs -> 24x24, array_record shards, batch 4, 2 batches, threads=1" in out, out
    for tree in ("this tree", "HEAD"):  # held, read, main, decode, resize, whole, the ceiling, held per round
        # held is a difference of two timings: on a loaded machine a tiny run's can come out below 0
        assert re.search(rf"^{tree} +(-?\d+ +){{6}} *(-?[\d,]+|-) records/s; held per round -?\d+ -?\d+$", out,
                         re.M), out
    for part in ("held", "read", "main", "whole"):
        assert re.search(rf"^{part}: -?\d+\.\d\dx the other tree's", out, re.M), out
    assert len(re.findall(r"^round [12], (this tree|HEAD): \{", proc.stderr, re.M)) == 4, proc.stderr[-3000:]
