"""Write a dataset's records back as files: DIR/<split>/<label>/<source file name>, the stored JPEG bytes exactly.

Names come from records, so they are sanitised: nothing in a record can put a file outside DIR, hide it, or
overwrite another. Every record written gets a row in DIR/extract_map.csv saying where it went and why a
name changed. Building again from DIR gives records with the same image bytes (pass-through keeps JPEGs).
"""
from __future__ import annotations

import csv
import os
import posixpath
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass

from shard_utils import inputs, storage
from shard_utils.errors import TpuShardsError
from shard_utils.format.manifest import Manifest, ManifestError, load
from shard_utils.read import find_record
from shard_utils.read.stored import StoredRecord, iter_split, label_texts

__all__ = [
    "MAP_NAME", "NAME_MAX", "MAX_EXTENSION", "MAP_COLUMNS", "ExtractError", "Extracted", "clean_name", "fit",
    "split_extension", "Namer", "Layout", "extract"
]

MAP_NAME = "extract_map.csv"
NAME_MAX = 255  # bytes in one file name on ext4, XFS, APFS, NTFS (UTF-16 units there), ...
MAX_EXTENSION = 16  # a longer "extension" is part of the name
MAP_COLUMNS = ("split", "shard", "record", "source_id", "labels", "path", "note")


class ExtractError(ValueError, TpuShardsError):
    """The extract request cannot be carried out as asked (unknown split or label, a non-empty folder, ...)."""


@dataclass(frozen=True)
class Extracted:
    """What `extract` wrote: records written, how many names had to change, and the map's path."""

    folder: str
    count: int
    renamed: int
    map_path: str


def clean_name(text: str, fallback: str = "_") -> tuple[str, bool]:
    """One path component made safe: no separators, control characters or leading dots (the build would skip
    it as hidden), no system folder name, at most NAME_MAX bytes. Returns (name, whether it changed)."""
    name = "".join("_" if c in "/\\" or unicodedata.category(c)[0] == "C" else c for c in text)
    stripped = name.lstrip(".")
    name = "_" * (len(name) - len(stripped)) + stripped
    if name.lower() in inputs.SYSTEM_DIRS or name.lower() in inputs.SYSTEM_NAMES:
        name = "_" + name
    name = name or fallback
    name = fit(name, NAME_MAX)
    return name, name != text


def fit(name: str, limit: int = NAME_MAX, suffix: str = "") -> str:
    """name with suffix inserted before its extension, the stem cut (never mid-character) so the whole is at
    most `limit` UTF-8 bytes."""
    stem, ext = split_extension(name)
    room = limit - len((suffix + ext).encode("utf-8"))
    cut = stem.encode("utf-8")[:max(room, 1)].decode("utf-8", "ignore") or "_"
    return cut + suffix + ext


def split_extension(name: str) -> tuple[str, str]:
    """('photo', '.jpg') from 'photo.jpg'; a name without a short extension has none."""
    dot = name.rfind(".")
    if dot <= 0 or len(name) - dot > MAX_EXTENSION:
        return name, ""
    return name[:dot], name[dot:]


class Namer:
    """Hands out names inside one folder tree, never the same twice (compared as a case-insensitive,
    NFC-normalised file system would), adding ~2, ~3, ... before the extension on a collision."""

    def __init__(self) -> None:
        self._used: set[tuple[str, str]] = set()

    def claim(self, folder: str, name: str) -> tuple[str, bool]:
        """A free name in folder based on name; whether a suffix was needed."""
        candidate, n = name, 1
        while self._key(folder, candidate) in self._used:
            n += 1
            candidate = fit(name, NAME_MAX, f"~{n}")
        self._used.add(self._key(folder, candidate))
        return candidate, n > 1

    @staticmethod
    def _key(folder: str, name: str) -> tuple[str, str]:
        return folder, unicodedata.normalize("NFC", name).casefold()


class Layout:
    """Decides where each record goes: split and label folders are named once per distinct text, so two
    labels never merge into one folder, and file names are unique within their folder."""

    def __init__(self) -> None:
        self._namer = Namer()
        self._folders: dict[tuple[str, ...], tuple[str, list[str]]] = {}

    def folder(self, parent: str, text: str) -> tuple[str, list[str]]:
        """The folder (relative, '/'-separated) for a split or label text under parent, and notes on its name."""
        key = (parent, text)
        if key not in self._folders:
            name, changed = clean_name(text)
            name, collided = self._namer.claim(parent, name)
            notes = (["folder name sanitised"] if changed else []) + (["folder name collision"] if collided else [])
            self._folders[key] = (posixpath.join(parent, name) if parent else name, notes)
        return self._folders[key]

    def file(self, folder: str, source_id: str, *, media_extension: bool) -> tuple[str, list[str]]:
        """The relative path of a record's file (or clip folder) in folder, named after its source file."""
        base = source_id.replace("\\", "/").rsplit("/", 1)[-1]
        name, changed = clean_name(base, fallback="record")
        notes = ["name sanitised"] if changed else []
        if media_extension and split_extension(name)[1].lower() not in inputs.MEDIA_EXTENSIONS:
            name = fit(name + ".jpg")
            notes.append("extension .jpg added")
        name, collided = self._namer.claim(folder, name)
        if collided:
            notes.append("name collision")
        return posixpath.join(folder, name), notes


def extract(dataset: str | Manifest, out_dir: str, *, split: str | None = None, label: str | None = None,
            limit: int | None = None, source_id: str | None = None) -> Extracted:
    """Write matching records (all by default) under out_dir, which must be a new or empty local folder."""
    m = dataset if isinstance(dataset, Manifest) else load(dataset)
    splits = _check_request(m, out_dir, split, label, limit)
    created = not os.path.exists(out_dir)
    map_path = os.path.join(out_dir, MAP_NAME)
    try:
        os.makedirs(out_dir, exist_ok=True)
        count, renamed = _extract_into(m, out_dir, map_path, splits, label, limit, source_id)
    except OSError as exc:
        raise ExtractError(f"cannot write into {out_dir}: {exc.strerror or exc}") from None
    except find_record.NotFound as exc:
        os.remove(map_path)
        if created:
            os.rmdir(out_dir)
        raise ExtractError(exc.message(f" in split(s) {', '.join(splits)}")) from None
    return Extracted(out_dir, count, renamed, map_path)


def _extract_into(m: Manifest, out_dir: str, map_path: str, splits: list[str], label: str | None,
                  limit: int | None, source_id: str | None) -> tuple[int, int]:
    """Write the matching records and the map; (records written, how many were renamed)."""
    layout = Layout()
    count = renamed = 0
    with open(map_path, "x", newline="", encoding="utf-8") as f:
        rows = csv.writer(f)
        rows.writerow(MAP_COLUMNS)
        for record in _matching(m, splits, label, source_id):
            if limit is not None and count >= limit:
                break
            labels = label_texts(m, record)
            path, notes = _place(layout, record, labels)
            _write_record(out_dir, path, record)
            rows.writerow([record.split, record.shard, record.index, record.source_id, "|".join(labels), path,
                           "; ".join(notes)])
            count += 1
            renamed += bool(notes)
            if source_id is not None:
                break
    return count, renamed


def _check_request(m: Manifest, out_dir: str, split: str | None, label: str | None,
                   limit: int | None) -> list[str]:
    if storage.is_gcs(out_dir):
        raise ExtractError(f"extract writes to a local folder, not {out_dir}")
    if os.path.exists(out_dir) and (not os.path.isdir(out_dir) or os.listdir(out_dir)):
        raise ExtractError(f"{out_dir} is not an empty folder; extract into a new or empty one")
    if limit is not None and limit < 1:
        raise ExtractError(f"--limit {limit} must be at least 1")
    if label is not None and label not in m.labels:
        shown = ", ".join(repr(x) for x in m.labels[:10]) + (" ..." if len(m.labels) > 10 else "")
        raise ExtractError(f"label {label!r} is not in this dataset; its labels are {shown}")
    if split is None:
        return list(m.splits)
    try:
        m.split(split)
    except ManifestError as exc:
        raise ExtractError(str(exc)) from None
    return [split]


def _matching(m: Manifest, splits: list[str], label: str | None, source_id: str | None) -> Iterator[StoredRecord]:
    """The records to write: every one of the splits (with the label, if given), or the one `source_id` names
    (its source id, a listing id, or a file name: find_record.find)."""
    def keep(record: StoredRecord) -> bool:
        return label is None or label in label_texts(m, record)

    records = (record for name in splits for record in iter_split(m, name))
    if source_id is not None:
        yield find_record.find(m, records, source_id, keep)
        return
    yield from filter(keep, records)


def _place(layout: Layout, record: StoredRecord, labels: list[str]) -> tuple[str, list[str]]:
    split_folder, split_notes = layout.folder("", record.split)
    label_folder, label_notes = layout.folder(split_folder, labels[0] if labels else "unlabeled")
    path, notes = layout.file(label_folder, record.source_id, media_extension=not record.is_video)
    return path, split_notes + label_notes + notes


def _write_record(out_dir: str, rel_path: str, record: StoredRecord) -> None:
    """The stored bytes at rel_path (a video clip: a folder of frame_000.jpg, ...), never over an existing file."""
    if record.is_video:
        for i, frame in enumerate(record.media):
            _write_new(out_dir, posixpath.join(rel_path, f"frame_{i:03d}.jpg"), frame)
    else:
        media = record.media
        _write_new(out_dir, rel_path, media[0] if media else b"")


def _write_new(out_dir: str, rel_path: str, data: bytes) -> None:
    root = os.path.realpath(out_dir)
    path = os.path.realpath(os.path.join(root, *rel_path.split("/")))
    if os.path.commonpath([root, path]) != root or path == root:  # cannot happen with clean names; never trust it
        raise ExtractError(f"refusing to write {rel_path!r} outside {out_dir}")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
