"""Checks that a dataset's croissant.json and README.md card say what its manifest says (and its files hold)."""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from shard_utils.format import croissant
from shard_utils.format.manifest import Manifest, load


def card_tables(text: str) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    """(records per split, {label: {split: count}}) read back from a card's two tables."""
    contents = text.split("## Contents", 1)[1].split("## Labels", 1)[0]
    splits = {m[1]: int(m[2]) for m in re.finditer(r"^\| (\S+) \| (\d+) \| \d+ \| [\d.]+ \|$", contents, re.M)}
    labels_part = text.split("## Labels", 1)[1].split("## How it was built", 1)[0]
    rows = [line.strip("|").split(" | ") for line in labels_part.splitlines() if line.startswith("| ")]
    header, body = rows[0], rows[1:]
    names = [h.strip() for h in header[2:]]
    labels = {row[1].strip(): {s: int(v) for s, v in zip(names, row[2:], strict=True)} for row in body}
    return splits, labels


def assert_described(out: Path) -> Manifest:
    """croissant.json lists exactly the manifest's files with their real SHA-256 and size; the card's counts are
    the manifest's."""
    m = load(str(out))
    doc = json.loads((out / "croissant.json").read_text(encoding="utf-8"))
    listed = {f["contentUrl"]: f for f in doc["distribution"] if f["@type"] == "cr:FileObject"}
    expected = {entry.path: entry for entry, _ in croissant.described_files(m)}
    assert set(listed) == set(expected) and expected
    for path, entry in listed.items():
        data = (out / path).read_bytes()
        assert entry["sha256"] == hashlib.sha256(data).hexdigest() == expected[path].sha256
        assert entry["contentSize"] == f"{len(data)} B"
    assert croissant.file_problems((out / "croissant.json").read_bytes(), m) == []
    labels = {r["labels/name"]: r["labels/id"] for rs in doc["recordSet"] if rs["@id"] == "labels" for r in rs["data"]}
    assert labels == {name: i + m.label_offset for i, name in enumerate(m.labels)}
    splits, by_label = card_tables((out / "README.md").read_text(encoding="utf-8"))
    assert splits == {name: s.num_records for name, s in m.splits.items()}
    assert by_label == {label: {name: s.class_counts.get(label, 0) for name, s in m.splits.items()}
                        for label in m.labels}
    return m
