"""`tpu-shards inspect --report`: contact sheets, charts and a page, on a dataset the real job built."""
from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, run_cli, run_job
from pages import assert_png, assert_safe_page
from PIL import Image, ImageChops, ImageStat

from shard_utils.format.manifest import load
from shard_utils.read import report
from shard_utils.read.stored import iter_split


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """The example generator's shapes (JPEG, PNG, WebP of varying heights), two bad files, built in 2 splits."""
    base = tmp_path_factory.mktemp("report")
    subprocess.run([sys.executable, str(REPO / "examples" / "make_sample_images.py"), "--output", str(base / "in"),
                    "--count", "72", "--size", "96"], check=True, capture_output=True)
    (base / "in" / "circle" / "broken.jpg").write_bytes(b"<html>not an image</html>")
    (base / "in" / "square" / "empty.png").write_bytes(b"")
    run_job(base / "in", base / "ds", "--splits", "train=0.75,validation=0.25", "--num-cores", "2")
    return base / "ds"


@pytest.mark.slow
def test_plain_inspect_prints_the_summary_and_writes_nothing(built, tmp_path):
    done = run_cli("inspect", built)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"{built}: 3 labels, image size varies, 2 cores x 1 host, TFRecord shards"
    assert lines[-1] == "  files seen 74, rejected 2, skipped 0"
    assert len(lines) == 4 and "report written" not in done.stdout


@pytest.mark.slow  # matplotlib/mkdocs: about 3 CPU seconds, at the fast subset's limit under load
def test_report_page_charts_and_sheets(built, tmp_path):
    out = tmp_path / "report"
    done = run_cli("inspect", built, "--report", out, "--seed", "3")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == f"tpu-shards: report written to {out / 'index.html'}"
    parsed = assert_safe_page(out / "index.html")
    images = [a["src"] for t, a in parsed.tags if t == "img"]
    m = load(str(built))
    clusters = m.quality["by_kind"]["near_duplicate"] + m.quality["by_kind"]["label_conflict"]
    assert images == ["classes.png", "shards.png", "sizes.png", "contact-00.png", "contact-01.png", "rejected.png",
                      *(["near-duplicates.png"] if clusters else [])]  # the fixture's drawn shapes do look alike
    text = " ".join(parsed.text)
    for name, split in m.splits.items():
        assert f"{name} {split.num_records} {len(split.shards)}" in " ".join(text.split())
    assert "circle/broken.jpg not_image" in " ".join(text.split())  # the first rejected files with reasons
    assert "square/empty.png empty" in " ".join(text.split())
    sizes = {name: assert_png(out / name).size for name in images}
    assert sizes["contact-00.png"][0] > 1000 and sizes["contact-00.png"][1] > 500  # 3 classes x 8 tiles
    assert sizes["classes.png"] == (600, 420) and sizes["shards.png"] == (1000, 560)


def crop_matches(sheet: Image.Image, box, jpeg: bytes) -> float:
    """Mean absolute difference between a sheet region and the record's own thumbnail."""
    expected = report.thumbnail(jpeg)
    region = sheet.crop(box)
    assert region.size == expected.size
    return sum(ImageStat.Stat(ImageChops.difference(region, expected)).mean) / 3


def test_contact_sheet_shows_the_sampled_records_by_class_and_seed(built):
    m = load(str(built))
    sample = report.sample_split(m, "train", seed=0, per_class=4)
    assert list(sample.groups) == ["circle", "square", "triangle"]
    for label, tiles in sample.groups.items():
        assert len(tiles) == 4 and all(t.labels == (label,) for t in tiles)
    sheet, placed = report.render_sheet(sample)
    assert len(placed) == 12
    stored = {r.source_id: r for r in iter_split(m, "train")}
    for p in placed:
        assert crop_matches(sheet, p.box, stored[p.tile.source_id].media[0]) < 1.0  # that record's pixels

    again = report.sample_split(m, "train", seed=0, per_class=4)
    other = report.sample_split(m, "train", seed=1, per_class=4)
    ids = lambda s: [t.source_id for tiles in s.groups.values() for t in tiles]  # noqa: E731
    assert ids(again) == ids(sample) and ids(other) != ids(sample)
    first, second = io.BytesIO(), io.BytesIO()
    report.render_sheet(sample)[0].save(first, "PNG")
    report.render_sheet(again)[0].save(second, "PNG")
    assert first.getvalue() == second.getvalue()


def test_max_records_bounds_what_is_read(built):
    m = load(str(built))
    sample = report.sample_split(m, "train", max_records=10)
    assert sample.scanned == 10 and sample.shards_read == 1 and len(sample.sizes) == 10
    assert sum(len(t) for t in sample.groups.values()) == 10  # all 10 read fit on the sheet (8 per class)


def test_report_of_a_bucket_matches_the_local_one(built, gcs, tmp_path):
    bucket = gcs.new_bucket("report")
    gcs.upload_tree(built, bucket, "ds")
    page = report.write_report(f"gs://{bucket}/ds", str(tmp_path / "remote"), seed=2)
    assert_safe_page(Path(page))
    local = load(str(built))
    for i, split in enumerate(local.splits):
        expected = report.render_sheet(report.sample_split(local, split, seed=2))[0]
        with Image.open(tmp_path / "remote" / f"contact-{i:02d}.png") as remote:
            assert ImageChops.difference(remote.convert("RGB"), expected).getbbox() is None
    assert "circle/broken.jpg" in Path(page).read_text()  # rejected.jsonl read from the bucket


def test_notebook_helpers_return_images(built):
    sheet = report.contact_sheet(str(built), "validation", per_class=2)
    chart = report.as_image(report.class_chart(str(built)))
    assert sheet.mode == chart.mode == "RGB" and chart.size == (600, 420)
    assert sheet.getextrema() != ((255, 255), (255, 255), (255, 255))


def test_report_without_matplotlib_is_one_line_naming_the_extra(built, tmp_path):
    script = ("import sys; sys.modules['matplotlib'] = None\n"  # as if the extra were not installed
              "from beam_jobs.cli import main\n"
              f"sys.exit(main(['inspect', {str(built)!r}, '--report', {str(tmp_path / 'r')!r}]))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        'tpu-shards: error: the dataset report needs matplotlib, which is not installed: pip install -e ".[report]"']
    assert not (tmp_path / "r").exists()


def test_many_classes_are_charted_sorted_and_sampled_by_seed(tmp_path):
    from handmade import image_record, write_dataset

    labels = [f"class {i:02d}" for i in range(45)]
    records = [image_record(i, i % 45, labels[i % 45], f"{labels[i % 45]}/{i}.jpg") for i in range(90 + 7)]
    m = write_dataset(tmp_path / "ds", {"train": records}, labels)
    report.as_image(report.class_chart(m)).save(tmp_path / "classes.png")
    assert assert_png(tmp_path / "classes.png").size == (900, 420)
    sample = report.sample_split(m, "train", seed=5)
    assert len(sample.groups) == report.MAX_CLASSES
    assert list(sample.groups) == sorted(sample.groups)  # shown in label order
    assert list(report.sample_split(m, "train", seed=6).groups) != list(sample.groups)
