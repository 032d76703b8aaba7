"""benchmarks/bench_peers.py: the per-image work the peers share, the output counts, the option checks, and a tiny run
with the peers this environment can import (the others must be reported missing)."""
from __future__ import annotations

import importlib.util
import io
import sys

import pytest
from PIL import Image

from benchmarks import bench_peers as bench
from benchmarks.peers_bench import outputs, work
from benchmarks.peers_bench.measure import Run
from benchmarks.peers_bench.report import MEASURES, RATIOS, figures, steady_cpu_ms


def jpeg(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.linear_gradient("L").convert("RGB").resize((width, height)).save(out, "JPEG", quality=90)
    return out.getvalue()


def test_reencode_gives_a_224_square_jpeg_and_the_check_refuses_a_cut_file():
    data = jpeg(400, 300)
    with Image.open(io.BytesIO(work.reencoded(data))) as small:
        assert (small.format, small.size, small.mode) == ("JPEG", (work.SIDE, work.SIDE), "RGB")
    work.checked(data)
    with pytest.raises(OSError):
        work.checked(data[: len(data) // 2])


def test_steady_cpu_takes_the_tiny_runs_cpu_away():
    big = [Run(5.0, cpu, 100.0, 0, "") for cpu in (9.0, 11.0, 10.0)]
    tiny = [Run(2.0, cpu, 90.0, 0, "") for cpu in (2.0, 2.5)]
    assert steady_cpu_ms(big, tiny, 1064, 64) == pytest.approx(1e3 * (10.0 - 2.25) / 1000)


def test_records_are_counted_from_the_tools_files(tmp_path):
    (tmp_path / "index.json").write_text('{"shards": [{"samples": 3}, {"samples": 4}], '
                                         '"chunks": [{"chunk_size": 5}]}')
    assert outputs.records("mds", tmp_path) == 7 and outputs.records("litdata", tmp_path) == 5
    assert outputs.records("webdataset", tmp_path / "absent") == 0
    assert outputs.records("mds", tmp_path / "absent") == 0


@pytest.mark.parametrize("argv, says", [
    (["--count", "8", "--tiny", "8"], "--count must be more than --tiny"),
    (["--rounds", "0"], "--rounds and --workers must be at least 1"),
    (["--peers", "webdataset,arrow"], "choose from webdataset, tfds, mds, litdata"),
    (["--modes", "fast"], "choose from pass, decode, reencode"),
    (["--peers-python", "/no/such/python"], "no such program"),
])
def test_bad_options_are_one_line_and_exit_2(argv, says, capsys):
    with pytest.raises(SystemExit) as stop:
        bench.main(argv)
    assert stop.value.code == 2 and says in capsys.readouterr().err


@pytest.mark.slow
def test_a_tiny_run_prints_every_row_for_the_tools_it_has(tmp_path, capsys):
    have = [p for p, module in (("webdataset", "webdataset"), ("mds", "streaming"), ("litdata", "litdata"))
            if importlib.util.find_spec(module)]
    code = bench.main(["--peers-python", sys.executable, "--count", "12", "--tiny", "8", "--rounds", "1",
                       "--modes", "pass", "--peers", ",".join(have or ["webdataset"]), "--work", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    header = next(line for line in out.splitlines() if line.split()[:1] == ["tpu-shards"])
    assert header.split() == ["tpu-shards", *have]
    for absent in {"webdataset"} - set(have):
        assert f"missing: {absent} (No module named 'webdataset')" in out
    cells = {label: next(line for line in out.splitlines() if line.startswith(f"pass-through: {label} "))
             .removeprefix(f"pass-through: {label}").split() for label, _, _ in MEASURES}
    assert all(len(row) == 1 + len(have) for row in cells.values())
    assert float(cells["wall s"][0]) > 0 and float(cells["fixed cost: CPU s"][0]) > 0
    assert float(cells["peak MB, all processes (PSS)"][0]) > 50  # a build's driver alone imports Beam
    for label, _ in RATIOS:
        row = next(line for line in out.splitlines() if line.startswith(f"pass-through: {label.format('tpu-shards')}"))
        cells = row.removeprefix(f"pass-through: {label.format('tpu-shards')}").split()
        assert cells[0] == "-" and len(cells) == 1 + len(have) and all(c.endswith("x") for c in cells[1:])
    assert "no-checks" not in out  # only with --checks-off


def test_each_of_our_columns_gets_its_own_ratios_to_each_peer_and_none_to_the_other():
    """--checks-off's column: wall and CPU per image of tpu-shards and of no-checks, each over each peer's."""
    def runs(wall, cpu):
        return [Run(wall, cpu, 300.0, 0, "")]
    measured = {}
    for tool, (wall, big_cpu, tiny_cpu) in {"tpu-shards": (4.0, 5.0, 3.0), "no-checks": (3.0, 4.0, 3.0),
                                             "webdataset": (2.0, 3.0, 2.5)}.items():
        measured[(tool, "pass", 1064)] = runs(wall, big_cpu)
        measured[(tool, "pass", 64)] = runs(1.0, tiny_cpu)
    rows = figures(measured, ["tpu-shards", "no-checks", "webdataset"], "pass", 1064, 64)
    assert rows["wall, tpu-shards / peer"] == {"webdataset": 2.0}
    assert rows["wall, no-checks / peer"] == {"webdataset": 1.5}
    assert rows["CPU per image (start-up subtracted), tpu-shards / peer"] == {"webdataset": pytest.approx(4.0)}
    assert rows["CPU per image (start-up subtracted), no-checks / peer"] == {"webdataset": pytest.approx(2.0)}
