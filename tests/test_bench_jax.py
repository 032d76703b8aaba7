"""benchmarks/bench_jax.py runs end to end at a tiny size (every candidate, every ratio), so it cannot rot."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from conftest import REPO

CANDIDATES = ("make_iterator", "make_iterator, resumed", "make_iterator, tensorflow", "Grain threads",
              "Grain mp_prefetch", "tf.data make_dataset")


@pytest.mark.jax
@pytest.mark.slow
@pytest.mark.tf
def test_bench_jax_runs_every_candidate_at_a_tiny_size(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_jax.py"), "--data", str(tmp_path), "--images", "32",
         "--source-size", "48", "--resize", "24", "--batch", "8", "--batches", "2", "--warmup", "1", "--rounds", "2",
         "--grain-workers", "1", "--threads", "2"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    out = proc.stdout
    assert "32 records in 8 shards per format, 48x48 JPEG -> 24x24 float32, batch 8" in out
    # a row each: median images/s, CPU ms per image, one figure per round
    for name in (*CANDIDATES, "make_iterator, 2 threads"):
        assert re.search(rf"^{re.escape(name)} +\d+ +\d+\.\d\d +\d+ \d+$", out, re.M), out
    ratios = re.findall(r"^(.+?) / (.+?): (\d+\.\d\d)x images/s \(target >= ([\d.]+)\)", out, re.M)
    assert [(a, b, t) for a, b, _, t in ratios] == [
        ("make_iterator", "Grain threads", "1.0"), ("make_iterator", "Grain mp_prefetch", "1.0"),
        ("make_iterator", "tf.data make_dataset", "0.9"), ("make_iterator, resumed", "make_iterator", "0.9"),
        ("make_iterator, tensorflow", "tf.data make_dataset", "0.9")]
    assert all(float(r) > 0 for _, _, r, _ in ratios)
    assert re.search(r"^make_iterator, 2 threads / make_iterator: \d+\.\d\dx images/s$", out, re.M), out
    # each measurement on stderr as it is made (a run cut short keeps them): every candidate in both rounds
    measured = re.findall(r"^round (\d), (.+?): \d+ images/s, \d+\.\d\d CPU ms/image \(\d+\.\d s with",
                          proc.stderr, re.M)
    assert sorted(measured) == sorted((r, name) for r in "12" for name in (*CANDIDATES, "make_iterator, 2 threads")), \
        proc.stderr[-3000:]
