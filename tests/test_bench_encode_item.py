"""A smoke run of benchmarks/bench_encode_item.py: every mode timed against the peers' floor, and the profile."""
from __future__ import annotations

import re
from pathlib import Path

from benchmarks import bench_encode_item as bench


def test_each_mode_is_timed_against_the_peers_floor(tmp_path, capsys):
    profile = tmp_path / "encode.prof"
    assert bench.main(["--count", "3", "--phone", "0", "--png", "2", "--rounds", "1", "--work", str(tmp_path),
                       "--profile", str(profile), "--pieces"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("jpg ")]
    assert [re.match(r"jpg +x3 +(\w+) *:", row)[1] for row in rows] == ["decode", "reencode", "structure"]
    for row in rows:
        ratios = [float(x) for x in re.findall(r"\(([\d.]+)x\)", row)]
        assert len(ratios) == 3 and ratios[-1] == 1.0 and all(r > 0 for r in ratios)
    png = [line for line in out.splitlines() if line.startswith("png ")]
    assert len(png) == 1 and re.match(r"png +x2 +q75-full *:", png[0]) and png[0].endswith("(1.00x)")
    assert profile.stat().st_size > 0 and "function calls" in out  # the top of the profile
    pieces = {f"{mode}{off or ''}": times for mode, off, times
              in re.findall(r"^ +jpg +(\w+) +tpu-shards(, checks off)? *: (.*)$", out, re.M)}
    assert set(pieces) == {mode + off for mode in ("decode", "reencode", "structure") for off in ("", ", checks off")}
    on = dict((name.strip(), float(us)) for name, us in re.findall(r"([a-z0-9 ]+) (\d+)(?:,|$)", pieces["decode"]))
    extra = {"marker walk", "source sha256", "framing", "run writer", "its writes"}
    assert set(on) == {"decode", "inspect", "signature", "sharpness", "colour spread"} | extra
    assert all(on[name] for name in ("decode", "inspect", "signature", "marker walk", "source sha256"))
    assert on["inspect"] > on["signature"] and on["run writer"] >= on["its writes"]
    assert pieces["decode, checks off"].startswith("decode ")
    assert "inspect" not in pieces["decode, checks off"]  # with the checks off nothing is inspected
    less = re.findall(r"less marker walk, source sha256, framing, run writer \(not its writes\): ([\d.]+) ms, "
                      r"the floor ([\d.]+) \(([\d.]+)x\)", out)
    assert len(less) == 2 * 3 + 2  # each jpg mode and the png one, checks on and off
    assert all(float(ms) > 0 and float(floor) > 0 for ms, floor, _ in less)


def test_another_checkout_is_timed_in_the_same_rounds(tmp_path, capsys):
    """--against: the other tree's encode_run (here this same checkout's) timed by a child process, its rows beside
    this checkout's, each with its ratio to the peers' floor."""
    tree = str(Path(bench.__file__).resolve().parents[1])
    assert bench.main(["--count", "2", "--phone", "0", "--rounds", "2", "--work", str(tmp_path),
                       "--against", tree]) == 0
    decode = next(line for line in capsys.readouterr().out.splitlines() if re.match(r"jpg +x2 +decode", line))
    times = dict(re.findall(r"(tpu-shards[^,(]*(?:, checks off)?(?: \(--against\))?) ([\d.]+) \(", decode))
    assert set(times) == {"tpu-shards", "tpu-shards, checks off", "tpu-shards (--against)",
                          "tpu-shards, checks off (--against)"} and all(float(t) > 0 for t in times.values())
