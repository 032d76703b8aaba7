"""File names that are not UTF-8 (Latin-1 names from old archives, b'caf\\xe9.jpg'): each is a record known by its
escaped name (bytes that are not UTF-8 as %XX, see names.escaped_name), the same from a folder walk and from a
listing, or a rejection with its reason; never the end of the build."""
from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path
from urllib.parse import unquote_to_bytes

import pytest
from conftest import photo, run_cli
from PIL import Image
from readers import by_source, decoded, rejected, shard_bytes

from shard_utils.format import names
from shard_utils.format.manifest import load
from shard_utils.inputs.listings import ListingOptions, ListingRow, item_from_row, resolve_path
from shard_utils.read.verify import verify

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="file names as bytes need a Linux file system")


def write(root: Path, name: bytes, content: bytes | None = None, seed: int = 0) -> None:
    path = os.fsencode(root) + b"/" + name
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if content is None:
        photo(24, 16, seed).save(path, "JPEG", quality=90)
    else:
        with open(path, "wb") as f:
            f.write(content)


@pytest.fixture
def latin1(tmp_path) -> Path:
    """Images and other files whose names (and one label folder's) are Latin-1 bytes."""
    root = tmp_path / "in"
    write(root, b"cat/caf\xe9.jpg", seed=1)
    write(root, b"cat/ok.jpg", seed=2)
    write(root, b"d\xf6g/\xff\xfe%.jpg", seed=3)  # a label folder too, and a '%' in a name that is escaped
    write(root, b"cat/broken\xe9.jpg", b"not a JPEG")
    write(root, b"cat/notes\xe9.txt", b"hello")
    write(root, b"loose\xe9.jpg", seed=4)
    os.mkfifo(os.fsencode(root) + b"/cat/pipe\xe9.jpg")
    return root


def test_escaped_names_are_utf8_and_give_the_bytes_back():
    name = os.fsdecode(b"d\xf6g/\xff\xfe%.jpg")
    assert names.escaped_name(name) == "d%F6g/%FF%FE%25.jpg"
    assert unquote_to_bytes(names.escaped_name(name)) == os.fsencode(name)
    assert names.escaped_name("ünïcödé 猫/100%.jpg") == "ünïcödé 猫/100%.jpg"  # UTF-8 names are their own id
    with pytest.raises(ValueError, match="lone surrogate"):
        names.escaped_name("x\ud800.jpg")


@pytest.mark.slow
def test_a_folder_with_names_that_are_not_utf8_builds_and_every_tool_reads_it(latin1, tmp_path):
    """A build, a second one (the same bytes), extract, inspect, and a build from what extract wrote (the same
    source ids) all take the names."""
    out = tmp_path / "out"
    done = run_cli("build", "--input", latin1, "--output", out, "--num-cores", "1", "--max-rejected", "100%")
    assert done.returncode == 0, done.stderr[-3000:]
    written = by_source(out)
    assert sorted(written) == ["cat/caf%E9.jpg", "cat/ok.jpg", "d%F6g/%FF%FE%25.jpg"]
    m = load(str(out))
    assert m.labels == ["cat", "d%F6g"]
    assert rejected(out) == {"cat/broken%E9.jpg": "not_image", "cat/pipe%E9.jpg": "not_regular_file",
                             "loose%E9.jpg": "no_label"}
    skipped = [json.loads(line) for line in (out / "skipped.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [s["source"] for s in skipped] == ["cat/notes%E9.txt"]
    assert verify(str(out), deep=True) == []

    again = tmp_path / "again"
    assert run_cli("build", "--input", latin1, "--output", again, "--num-cores", "1",
                   "--max-rejected", "100%").returncode == 0
    assert shard_bytes(again) == shard_bytes(out)  # the escape is a function of the name: determinism holds

    extracted = tmp_path / "extracted"
    assert run_cli("extract", out, extracted).returncode == 0
    assert (extracted / "train" / "cat" / "caf%E9.jpg").read_bytes() == written["cat/caf%E9.jpg"][
        "image/encoded"]
    page = tmp_path / "report"
    done = run_cli("inspect", out, "--report", page)
    assert done.returncode == 0 and "d%F6g" in (page / "index.html").read_text(encoding="utf-8")

    # extract wrote each record under its escaped name, which is UTF-8: building from there keeps the ids.
    (extracted / "extract_map.csv").unlink()
    rebuilt = tmp_path / "rebuilt"
    done = run_cli("build", "--input", extracted / "train", "--output", rebuilt, "--num-cores", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(by_source(rebuilt)) == sorted(written)


@pytest.mark.slow
def test_a_listing_names_such_a_file_as_the_walk_does(latin1, tmp_path):
    """A CSV cell may hold the name's raw bytes (as `find` prints them), a JSONL line its surrogate escapes
    (as Python's json writes os.listdir's names): both give the walk's source id; other cells must be UTF-8."""
    csv_listing = tmp_path / "list.csv"
    csv_listing.write_bytes(b"path,label\ncat/caf\xe9.jpg,cat\ncat/ok.jpg,c\xe9t\n")
    jsonl_listing = tmp_path / "list.jsonl"
    jsonl_listing.write_text(json.dumps({"path": os.fsdecode(b"d\xf6g/\xff\xfe%.jpg"), "label": "dog"}) + "\n"
                             + json.dumps({"path": "cat/ok.jpg", "label": "\udce9"}) + "\n", encoding="ascii")
    for listing in (csv_listing, jsonl_listing):
        out = tmp_path / listing.suffix[1:]
        done = run_cli("build", "--input", latin1, "--listing", listing, "--output", out, "--num-cores", "1",
                       "--max-rejected", "100%")
        assert done.returncode == 0, done.stderr[-3000:]
        assert rejected(out) == {"cat/ok.jpg": "bad_row"}
        assert "column 'label' is not UTF-8 text" in (out / "rejected.jsonl").read_text(encoding="utf-8")
    assert list(by_source(tmp_path / "csv")) == ["cat/caf%E9.jpg"]
    assert list(by_source(tmp_path / "jsonl")) == ["d%F6g/%FF%FE%25.jpg"]


def row(path: str) -> ListingRow:
    return ListingRow("l.jsonl", "byte", (0, 0), {"path": path, "label": "cat"})


def test_a_listed_name_no_file_can_have_is_a_bad_row():
    options = ListingOptions(path_column="path")
    lone = item_from_row(row("cat/x\ud800.jpg"), options, "/in")
    assert lone.reason == "bad_row" and "lone surrogate \\ud800" in lone.message
    bucket = item_from_row(row("gs://b/caf\udce9.jpg"), options, None)
    assert bucket.reason == "bad_row" and "is not UTF-8 text; a gs:// object name always is" in bucket.message
    under_bucket = item_from_row(row("caf\udce9.jpg"), options, "gs://b/in")
    assert under_bucket.reason == "bad_row"
    nul = item_from_row(row("cat/a\x00b.jpg"), options, "/in")  # JSON's "\u0000": os.stat would raise ValueError
    assert nul.reason == "bad_row" and "holds a NUL character" in nul.message
    assert resolve_path("/in/caf\udce9.jpg", None) == ("/in/caf%E9.jpg", "/in/caf\udce9.jpg")


@pytest.mark.slow
def test_a_name_escaping_to_another_files_name_is_rejected_not_given_its_id(tmp_path):
    """b'caf\\xe9.jpg' escapes to 'caf%E9.jpg', a name another file may have: the file whose name is its id is
    kept (in a walk and in a listing alike), the other rejected `name_taken`."""
    root = tmp_path / "in"
    write(root, b"cat/caf\xe9.jpg", seed=1)
    write(root, b"cat/caf%E9.jpg", seed=2)
    write(root, b"cat/ok.jpg", seed=3)
    listing = tmp_path / "list.csv"
    listing.write_bytes(b"path,label\ncat/caf\xe9.jpg,cat\ncat/caf%E9.jpg,cat\ncat/ok.jpg,cat\n")
    literal = (root / "cat" / "caf%E9.jpg").read_bytes()
    for how, args in {"walk": [], "listing": ["--listing", listing]}.items():
        out = tmp_path / how
        done = run_cli("build", "--input", root, *args, "--output", out, "--num-cores", "1")
        assert done.returncode == 0, done.stderr[-3000:]
        assert rejected(out) == {"cat/caf%E9.jpg": "name_taken"}
        written = by_source(out)
        assert sorted(written) == ["cat/caf%E9.jpg", "cat/ok.jpg"]
        assert decoded(written["cat/caf%E9.jpg"]).getpixel((5, 5)) == _pixel(literal), how


def _pixel(data: bytes) -> tuple:
    return Image.open(io.BytesIO(data)).convert("RGB").getpixel((5, 5))


@pytest.mark.parametrize("argv", [
    ["build", "--input", "in\udce9", "--output", "out"],
    ["build", "--input", "in", "--output", "out\udce9"],
    ["build", "--listing", "l\udce9.csv", "--output", "out"],
    ["reshard", "src\udce9", "dst"],
    ["reshard", "src", "dst\udce9"],
])
def test_a_job_path_that_is_not_utf8_is_a_one_line_error(argv, capsys, tmp_path, monkeypatch):
    """The job's own paths travel through its steps as UTF-8 text and into the manifest: they must be UTF-8 (the
    files inside an input need not be)."""
    from beam_jobs.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "%E9" in lines[0] and "(shown escaped) is not UTF-8" in lines[0], lines


ESCAPES = {  # a name of each kind, holding a terminal control sequence
    b"cat/\x1b[31mred.jpg": None,  # a record: colours a terminal that prints it raw
    b"cat/\x1b[31mbroken\x07.jpg": b"not a JPEG",  # a rejection, its name in the reject-limit message
    b"cat/x.\x1b]0;PWNED\x07": b"hello",  # skipped: its extension retitles the terminal from the summary
    b"dog\x1b[32m/ok.jpg": None,  # a label
    b"dog\x1b[32m/\xe2\x80\xaegnp.jpg": None,  # right-to-left override: a format character
}
RAW_CONTROL = [chr(c) for c in (*range(0x00, 0x09), *range(0x0b, 0x20), 0x7f)] + ["\u202e", "\u2028"]


def raw_controls(text: str) -> list[str]:
    return [line for line in text.split("\n") if any(c in line for c in RAW_CONTROL)]


@pytest.mark.slow
def test_no_name_reaches_the_terminal_or_the_report_with_its_control_characters(tmp_path):
    """Everything the tools print (stdout, stderr, the build summary, the reject-limit error, verify's findings,
    inspect, the report page) shows the names escaped; the reports (.jsonl) keep them JSON-escaped."""
    root = tmp_path / "in"
    for i, (name, content) in enumerate(ESCAPES.items()):
        write(root, name, content, seed=i)
    for i in range(3):
        write(root, f"cat/img{i}.jpg".encode(), seed=10 + i)
    out = tmp_path / "out"
    runs = [run_cli("build", "--input", root, "--output", tmp_path / "refused", "--num-cores", "1",
                     "--max-rejected", "0"),
            run_cli("build", "--input", root, "--output", out, "--num-cores", "1"),
            run_cli("verify", out, "--deep"), run_cli("inspect", out, "--report", tmp_path / "report")]
    assert [r.returncode for r in runs] == [1, 0, 0, 0], [r.stderr[-2000:] for r in runs]
    assert "e.g. cat/\\x1b[31mbroken\\x07.jpg" in runs[0].stderr
    assert "not media: .\\x1b]0;pwned\\x07 1" in runs[0].stderr
    assert "not media: .\\x1b]0;pwned\\x07 1" in runs[1].stdout
    for run in runs:
        assert raw_controls(run.stdout + run.stderr) == [], run.args
    page = (tmp_path / "report" / "index.html").read_text(encoding="utf-8")
    assert raw_controls(page) == [] and "dog\\x1b[32m" in page
    lines = (out / "rejected.jsonl").read_text(encoding="utf-8") + (out / "skipped.jsonl").read_text(encoding="utf-8")
    assert raw_controls(lines) == [] and "\\u001b[31mbroken\\u0007.jpg" in lines  # JSON escapes: data kept whole
