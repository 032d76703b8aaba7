"""The quality checks in a real build: signatures in the index, flags in quality.jsonl and the manifest, verify."""
from __future__ import annotations

import json
import shutil

import pytest
from PIL import ImageFilter
from test_quality import scene

import beam_jobs
from shard_utils.format.index import read_index
from shard_utils.quality.findings import IMAGE_KINDS, NEAR_DUPLICATE
from shard_utils.quality.signature import NEAR_DISTANCE, from_hex, hamming
from shard_utils.read.verify import verify

pytestmark = pytest.mark.slow  # each builds a dataset (about 5 s)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    base = tmp_path_factory.mktemp("quality")
    images = base / "images"
    for label in ("a", "b"):
        (images / label).mkdir(parents=True)
    for i in range(6):
        scene(i, (240, 180)).save(images / ("a" if i % 2 else "b") / f"{i}.jpg", quality=90)
    scene(0, (240, 180)).resize((80, 60)).save(images / "b" / "0-small-copy.png")  # small, and a near-duplicate
    scene(1, (240, 180)).filter(ImageFilter.GaussianBlur(6)).save(images / "a" / "blurred.jpg", quality=90)
    scene(3, (400, 100)).save(images / "a" / "banner.jpg", quality=90)
    scene(5, (240, 180)).convert("L").save(images / "a" / "grey.jpg", quality=90)
    beam_jobs.build(images, base / "out", splits="train=0.5,test=0.5", num_cores=1, workers=1)
    return base


def test_flags_are_listed_in_quality_jsonl_and_counted_in_the_manifest(built):
    lines = [json.loads(line) for line in (built / "out" / "quality.jsonl").read_text().splitlines()]
    assert sorted((f["kind"], f["sources"][0]) for f in lines if f["kind"] in IMAGE_KINDS) == [
        ("aspect", "a/banner.jpg"), ("blur", "a/blurred.jpg"), ("grayscale", "a/grey.jpg"),
        ("small", "b/0-small-copy.png")]
    # each changed copy is also a near-duplicate of its scene (--near-dups report, the default)
    assert sorted(f["sources"] for f in lines if f["kind"] == NEAR_DUPLICATE) == [
        ["a/1.jpg", "a/blurred.jpg"], ["a/3.jpg", "a/banner.jpg"], ["a/5.jpg", "a/grey.jpg"],
        ["b/0-small-copy.png", "b/0.jpg"]]
    assert [f["sources"][0] for f in lines] == sorted(f["sources"][0] for f in lines)  # sorted like the reports
    manifest = json.loads((built / "out" / "manifest.json").read_text())
    assert manifest["quality"]["count"] == 8 and manifest["quality"]["path"] == "quality.jsonl"
    assert {k: n for k, n in manifest["quality"]["by_kind"].items() if n} == {"aspect": 1, "blur": 1, "grayscale": 1,
                                                                             "small": 1, "near_duplicate": 4}
    assert manifest["options"]["quality_checks"] == "on"
    assert "## Quality\n\n8 findings" in (built / "out" / "README.md").read_text()  # the dataset card says so


def test_every_row_of_the_index_holds_its_signature(built):
    rows = {r.source_id: r.phash for split in ("train", "test")
            for r in read_index(open(built / "out" / f"{split}.index.avro", "rb"))}
    assert len(rows) == 10 and all(len(p) == 16 for p in rows.values())
    assert hamming(from_hex(rows["b/0.jpg"]), from_hex(rows["b/0-small-copy.png"])) <= NEAR_DISTANCE
    assert hamming(from_hex(rows["b/0.jpg"]), from_hex(rows["b/2.jpg"])) > NEAR_DISTANCE


def test_verify_catches_a_tampered_quality_jsonl(built, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(built / "out", out)
    assert verify(str(out)) == []
    report = out / "quality.jsonl"
    lines = report.read_text().splitlines()
    report.write_text("\n".join(lines[1:]) + "\n")
    n = len(lines)
    assert any(f"{n - 1} findings listed, the manifest says {n}" in p for p in verify(str(out)))
    report.write_text("\n".join(lines[:-1] + ['{"kind": "blur", "sources": ["x.jpg"]}']) + "\n")
    assert any(f"line {n} is not a finding" in p for p in verify(str(out)))
    report.unlink()
    assert "quality.jsonl: missing" in verify(str(out))


def test_structure_mode_decodes_nothing_and_off_checks_nothing(built, tmp_path):
    beam_jobs.build(built / "images", tmp_path / "s", validate="structure", num_cores=1, workers=1)
    rows = [r for r in read_index(open(tmp_path / "s" / "train.index.avro", "rb"))]
    passed = [r for r in rows if r.source_id.endswith(".jpg")]  # kept byte for byte: no pixels decoded
    assert passed and all(r.phash == "" for r in passed)
    kinds = {json.loads(line)["kind"] for line in (tmp_path / "s" / "quality.jsonl").read_text().splitlines()}
    assert kinds == {"aspect", "small"}  # the size flags only (the PNG is decoded: it is re-encoded)
    beam_jobs.build(built / "images", tmp_path / "off", quality_checks="off", num_cores=1, workers=1)
    assert not (tmp_path / "off" / "quality.jsonl").exists()
    assert "quality" not in json.loads((tmp_path / "off" / "manifest.json").read_text())
    assert {r.phash for r in read_index(open(tmp_path / "off" / "train.index.avro", "rb"))} == {""}


@pytest.fixture(scope="module")
def reported(built, tmp_path_factory):
    """The built dataset with near-duplicate findings added to quality.jsonl (as the clustering writes them: one
    leaking across splits, one within a split), and its report."""
    from shard_utils.quality import findings
    from shard_utils.read.report import write_report

    out = tmp_path_factory.mktemp("reported") / "out"
    shutil.copytree(built / "out", out)
    splits = {r.source_id: split for split in ("train", "test")
              for r in read_index(open(out / f"{split}.index.avro", "rb"))}
    train, test = sorted(s for s in splits if splits[s] == "train"), sorted(s for s in splits if splits[s] == "test")
    within = findings.finding(findings.NEAR_DUPLICATE, train[:2], ["train"] * 2, distance=2)
    leak = findings.finding(findings.NEAR_DUPLICATE, [train[2], test[0]], ["train", "test"], distance=1)
    with open(out / "quality.jsonl", "a") as f:
        f.writelines(json.dumps(x) + "\n" for x in (within, leak))
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["quality"]["count"] += 2
    manifest["quality"]["by_kind"]["near_duplicate"] += 2  # the build's own clusters, and these
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert verify(str(out)) == []
    page = write_report(str(out), str(out.parent / "report"))
    return out, page, leak, within


def test_the_report_shows_leaks_first_then_clusters_and_flags(reported):
    from PIL import Image

    out, page, leak, within = reported
    from shard_utils.quality import findings

    text = open(page).read()
    shown = [f for f in map(json.loads, (out / "quality.jsonl").read_text().splitlines())
             if f["kind"] in findings.CLUSTER_KINDS]  # the build's own clusters, and the two added
    assert f"{sum(map(findings.leaks, shown))} of the {len(shown)} shown span several splits" in text
    table = text[text.index("<h3>Near-duplicates"):]
    assert table.index(leak["sources"][1]) < table.index(within["sources"][1])  # the leak's row first
    assert "a/blurred.jpg" in text[text.index("<h3>Flagged images"):]
    sheet = Image.open(out.parent / "report" / "near-duplicates.png")
    assert sheet.width >= 720 and sheet.height > 2 * 128  # two rows of tiles


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine (Debian: apt-get install chromium)")
def test_the_quality_section_in_a_headless_browser(reported, tmp_path):
    import subprocess

    _, page, leak, _ = reported
    args = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([*args, "--dump-dom", f"file://{page}"], capture_output=True, text=True, timeout=120).stdout
    assert '<img src="near-duplicates.png"' in dom and "<h2>Quality</h2>" in dom
    assert dom.index(leak["sources"][0]) < dom.index("<h3>Flagged images")


def test_an_append_adds_its_findings_after_the_datasets(built, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(built / "out", out)
    images = tmp_path / "images"
    shutil.copytree(built / "images", images)
    scene(9, (50, 40)).save(images / "a" / "tiny.png")
    beam_jobs.build(images, out, append=True, workers=1)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["quality"]["path"] == "quality.g001.jsonl" and manifest["quality"]["by_kind"]["small"] == 2
    lines = [json.loads(line) for line in (out / "quality.g001.jsonl").read_text().splitlines()]
    assert lines[-1] == {"kind": "small", "sources": ["a/tiny.png"], "splits": [lines[-1]["splits"][0]],
                         "value": 40.0, "threshold": 64.0, "generation": 1}
    assert len(lines) == len((built / "out" / "quality.jsonl").read_text().splitlines()) + 1
    assert not (out / "quality.jsonl").exists() and verify(str(out)) == []
