"""A smoke run of benchmarks/bench_near_dups.py: its table and its cost measurement on a few images."""
from __future__ import annotations

import re

from benchmarks import bench_near_dups as bench


def test_the_table_names_every_transformation_with_recall_and_precision(capsys):
    assert bench.main(["--originals", "4", "--build-images", "0"]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [line for line in out if line.startswith("| ") and "% /" in line]
    assert [row.split(" | ")[0][2:] for row in rows] == list(bench.TRANSFORMS)
    cells = [float(x) for row in rows for x in re.findall(r"([\d.]+)% /", row)]
    assert len(cells) == 4 * len(rows) and all(0 <= x <= 100 for x in cells)
    assert rows[0].count("100.0% / 100.0%") == 4  # four resized photos are found by each method
    blur = {line.split(" | ")[0][2:]: line for line in out if line.startswith("| ") and "% /" not in line}
    # sharp kept, blurred flagged
    assert blur["0.0%"].endswith("| 0% | 0% |") and blur["4.0%"].endswith("| 100% | 100% |")


def test_the_encode_cost_is_measured_with_and_without_the_checks(tmp_path):
    root, fifth = bench.write_inputs(tmp_path, 5, "JPEG")
    assert len(list(root.rglob("*.jpg"))) == 5 and len(list(fifth.rglob("*.jpg"))) == 1
    assert bench.encode_cpu(root, True) > 0 and bench.encode_cpu(root, False) > 0
