"""A dataset built by hand to attack `extract` and the report: nothing in a record may choose where files
go or what the page does. Label texts and source ids hold `..`, `/`, absolute paths, NUL and control
characters, markup, names longer than a file system allows, and names that collide."""
from __future__ import annotations

import csv
import os
import shutil
import subprocess
import unicodedata
from pathlib import Path

import pytest
from handmade import image_record, rejected_line, video_record, write_dataset
from pages import assert_png, assert_safe_page
from PIL import Image

from shard_utils.format.manifest import load
from shard_utils.read import report
from shard_utils.read.extract import MAP_NAME, NAME_MAX, extract
from shard_utils.read.stored import iter_split

SCRIPT = "<script>alert(1)</script>"
IMG = '<img src=x onerror="document.title=\'pwned\'">'
LABELS = ["../../escape", "/etc/passwd", SCRIPT, "nul\x00byte\x1b[31mred", "L" * 300, "\u00e9" * 200,
          "$\\frac{1}{0}$ & \"q\" 'x'", ".", "CaseA", "casea", IMG, "__MACOSX"]
SOURCES = ["../../../../outside.jpg", "/abs/path/abs.jpg", "a\x00b.jpg", "dir\\..\\..\\win.jpg", "x" * 400 + ".jpg",
           "a/same.jpg", "b/same.jpg", "c/SAME.jpg", "noext", ".hidden.jpg", "..", "", IMG + ".jpg",
           "\u202egnp.exe", "line\nbreak.jpg", "\u00e9" * 130 + ".jpg", "garbage.jpg"]


def hostile_records():
    records = []
    for i, source in enumerate(SOURCES):
        label = i % len(LABELS)
        if source.startswith(("a/", "b/", "c/")):
            label = 2  # the same label folder: the three `same.jpg` collide
        data = b"not a jpeg at all" if source == "garbage.jpg" else None
        records.append(image_record(i, label, LABELS[label], source, data))
    # every label gets at least one record, so every folder name is exercised
    records += [image_record(100 + k, k, LABELS[k], f"extra/{k}.jpg") for k in range(len(LABELS))]
    return records


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    base = tmp_path_factory.mktemp("hostile")
    records = hostile_records()
    in_train = [i % 2 == 0 or "same" in r.source_id.lower() for i, r in enumerate(records)]
    m = write_dataset(
        base / "ds", {"train": [r for r, t in zip(records, in_train, strict=True) if t],
                      "split-b": [r for r, t in zip(records, in_train, strict=True) if not t]}, LABELS,
        shard_prefix={"split-b": "evil"},
        rejected=[rejected_line(IMG, "<b>reason</b>", SCRIPT), "this line is not json <i>x</i>",
                  rejected_line("../x.jpg", "corrupt", "bad\x00data")],
        rejected_by_reason={"<b>reason</b>": 1, "corrupt": 2},
        options={"target_shard_mb": 128.0, "note": IMG, "script": SCRIPT}, input_text=SCRIPT)
    assert load(str(base / "ds")).splits.keys() == m.splits.keys()  # the manifest is valid
    return base


@pytest.fixture(scope="module")
def hostile_page(hostile) -> Path:
    return Path(report.write_report(str(hostile / "ds"), str(hostile / "report")))


def snapshot(root: Path, skip: Path) -> set[str]:
    return {str(p) for p in root.rglob("*") if skip not in p.parents and p != skip}


def test_extract_writes_only_under_dir_with_safe_unique_names(hostile, tmp_path):
    out = tmp_path / "nested" / "out"
    before = snapshot(hostile / "ds", hostile / "nothing") | snapshot(tmp_path, out)
    done = extract(str(hostile / "ds"), str(out))
    after = snapshot(hostile / "ds", hostile / "nothing") | snapshot(tmp_path, out)
    assert after - before == {str(tmp_path / "nested")}  # nothing written anywhere but DIR
    assert not (Path("/abs").exists() or Path("/outside.jpg").exists())

    m = load(str(hostile / "ds"))
    stored = {(r.split, r.shard, r.index): r for name in m.splits for r in iter_split(m, name)}
    assert done.count == len(stored) == len(hostile_records())
    with open(out / MAP_NAME, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == done.count
    real_out = os.path.realpath(out)
    for row in rows:
        record = stored[(row["split"], row["shard"], int(row["record"]))]
        assert row["source_id"] == record.source_id  # the map keeps the original text, NUL and all
        path = out / row["path"]
        assert os.path.realpath(path).startswith(real_out + os.sep)
        assert path.read_bytes() == record.media[0]  # exactly the stored bytes, even when not a JPEG
        for part in row["path"].split("/"):
            assert 0 < len(part.encode("utf-8")) <= NAME_MAX and not part.startswith(".")
            assert not any(unicodedata.category(c)[0] == "C" for c in part), part
    files = [p for p in out.rglob("*") if p.is_file() and p.name != MAP_NAME]
    assert len(files) == done.count

    # Collisions: distinct names in every folder even on a case-insensitive file system, with a note.
    for folder in {p.parent for p in files}:
        names = [p.name.casefold() for p in folder.iterdir()]
        assert len(names) == len(set(names))
    same = [r for r in rows if r["source_id"].endswith(("same.jpg", "SAME.jpg"))]
    assert [Path(r["path"]).name for r in same] == ["same.jpg", "same~2.jpg", "SAME~3.jpg"]
    assert sum("collision" in r["note"] for r in same) == 2
    # Two labels that differ only in case get two folders; a label never merges into another.
    label_folders = {(r["split"], r["labels"]): r["path"].rsplit("/", 1)[0] for r in rows}
    assert len(set(label_folders.values())) == len(label_folders)
    # The long and multi-byte names were cut on a character boundary, keeping the extension.
    long_rows = [r for r in rows if len(r["source_id"].encode()) > NAME_MAX]
    assert long_rows and all(Path(r["path"]).name.endswith(".jpg") for r in long_rows)
    assert done.renamed == sum(bool(r["note"]) for r in rows) > 10


def test_extract_filters_on_hostile_values_and_refuses_a_non_empty_dir(hostile, tmp_path):
    done = extract(str(hostile / "ds"), str(tmp_path / "one"), source_id="a\x00b.jpg")
    assert done.count == 1
    (path,) = [p for p in (tmp_path / "one").rglob("*") if p.is_file() and p.name != MAP_NAME]
    assert path.name == "a_b.jpg"
    done = extract(str(hostile / "ds"), str(tmp_path / "label"), label="../../escape")
    assert done.count == sum(r.label_text == "../../escape" for r in hostile_records()) == 3
    written = [p for p in (tmp_path / "label").rglob("*") if p.is_file() and p.name != MAP_NAME]
    assert len(written) == 3 and {p.parent.name for p in written} == {"___.._escape"}  # "/" and leading dots gone
    from shard_utils.read.extract import ExtractError

    with pytest.raises(ExtractError, match="not an empty folder"):
        extract(str(hostile / "ds"), str(tmp_path / "label"))
    with pytest.raises(ExtractError, match="is not in this dataset"):
        extract(str(hostile / "ds"), str(tmp_path / "x"), label="nope")
    with pytest.raises(ExtractError, match="no record .*has source id"):
        extract(str(hostile / "ds"), str(tmp_path / "y"), source_id="nope")
    assert not (tmp_path / "y").exists()  # nothing left behind by a request that matched nothing


def test_report_escapes_every_hostile_text(hostile_page):
    page = hostile_page
    parsed = assert_safe_page(page)
    text = "".join(parsed.text)
    assert SCRIPT in text and IMG in text  # shown as text, never as markup
    assert "this line is not json <i>x</i>" in text and "<b>reason</b>" in text
    assert "bad\\x00data" in text and "nul\\x00byte\\x1b[31mred" in text  # control characters shown escaped
    assert [a["src"] for t, a in parsed.tags if t == "img"] == [
        "classes.png", "shards.png", "sizes.png", "contact-00.png", "contact-01.png", "rejected.png"]
    for png in sorted(page.parent.glob("*.png")):
        assert_png(png)
    assert sorted(p.name for p in page.parent.iterdir()) == [
        "classes.png", "contact-00.png", "contact-01.png", "index.html", "rejected.png", "shards.png", "sizes.png"]


def test_contact_sheet_marks_a_record_that_does_not_decode(hostile):
    m = load(str(hostile / "ds"))
    split = next(name for name in m.splits
                 if any(r.source_id == "garbage.jpg" for r in iter_split(m, name)))
    sample = report.sample_split(m, split, per_class=50)
    sheet, placed = report.render_sheet(sample)
    boxes = {p.tile.source_id: p.box for p in placed}
    left, top, right, bottom = boxes["garbage.jpg"]
    assert right == left and bottom == top  # nothing pasted: the tile says "does not decode"
    decoded = [b for s, b in boxes.items() if s != "garbage.jpg"]
    assert decoded and all(b[2] - b[0] == 120 and b[3] - b[1] == 90 for b in decoded)  # 40x30 enlarged 3x


def test_video_records_extract_as_frame_folders_and_show_their_first_frame(tmp_path):
    clips = [video_record(i, i % 2, ["walk", "run"][i % 2], f"{['walk', 'run'][i % 2]}/clip{i}.mp4")
             for i in range(4)]
    write_dataset(tmp_path / "ds", {"train": clips}, ["walk", "run"], media="video")
    done = extract(str(tmp_path / "ds"), str(tmp_path / "out"))
    assert done.count == 4
    frames = sorted(p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out").rglob("*.jpg"))
    assert frames[:3] == ["train/run/clip1.mp4/frame_000.jpg", "train/run/clip1.mp4/frame_001.jpg",
                          "train/run/clip1.mp4/frame_002.jpg"]
    assert len(frames) == 12
    clip = next(c for c in clips if c.source_id == "run/clip1.mp4")
    assert [(tmp_path / "out" / f).read_bytes() for f in frames[:3]] == list(clip.frames)

    m = load(str(tmp_path / "ds"))
    sample = report.sample_split(m, "train")
    assert all(t.frames == 3 for tiles in sample.groups.values() for t in tiles)
    sheet, placed = report.render_sheet(sample)
    tile = next(p for p in placed if p.tile.source_id == "run/clip1.mp4")
    first = Image.open(__import__("io").BytesIO(clip.frames[0])).convert("RGB")
    # the tile holds the first frame: compare a pixel below the "frames" badge
    x, y = tile.box[0] + 20, tile.box[3] - 5
    assert max(abs(a - b) for a, b in zip(sheet.getpixel((x, y)), first.getpixel((20, 25)), strict=True)) <= 12


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine (Debian: apt-get install chromium)")
def test_report_in_a_headless_browser(hostile_page, tmp_path):
    """What a browser makes of the page: the DOM holds no injected element and the title is ours."""
    page = hostile_page
    args = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([*args, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120).stdout
    assert dom.count("<img") == 6 and "<script" not in dom.lower() and "pwned" not in dom.split("</title>")[0]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in dom
    shot = tmp_path / "shot.png"
    subprocess.run([*args, "--window-size=1200,2400", f"--screenshot={shot}", page.as_uri()], capture_output=True,
                   timeout=120)
    assert_png(shot, (1200, 2400))
