"""A smoke run of benchmarks/bench_startup.py: its table and breakdown on a few images, and its parsing."""
from __future__ import annotations

import subprocess
import sys

import pytest

from benchmarks import bench_startup as bench


def test_import_times_are_read_per_module_from_python_importtime():
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", "import json"], capture_output=True, text=True,
                          check=True)
    found = bench.imports(done.stderr)
    assert "json" in found and "json.decoder" in found and all(us >= 0 for us in found.values())


def test_phases_are_the_spans_between_the_marks_the_child_wrote():
    marks = {"interpreter up": 0.1, "imports done": 1.5, "graph begun": 1.6, "graph built": 2.1, "run begun": 2.1,
             "steps begun": 2.4, "steps done": 3.0, "command done": 3.2}
    spans = dict(bench.phases(marks))
    assert spans["imports"] == pytest.approx(1.4) and spans["graph construction"] == pytest.approx(0.5)
    assert spans["steps (the run)"] == pytest.approx(0.6) and "pool start (call, overlapped)" not in spans


@pytest.mark.slow
def test_a_tiny_run_prints_the_ratio_phases_and_counts(tmp_path, capsys):
    assert bench.main(["--count", "8", "--rounds", "1", "--work", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    ratio = float(out.split("ratio build / floor (wall): ")[1].split()[0])
    assert ratio > 1  # a build imports Beam and then builds and runs a graph
    assert "graph construction" in out and "imported that a plain build never needs: none" in out
    bundles = int(out.split("_execute_bundle (fn_runner.py)")[1].split()[0])
    assert bundles > 0
