"""Which input files are media, and where their label and split come from.

Pure functions over paths relative to the input root, '/'-separated.
"""
from __future__ import annotations

from dataclasses import dataclass

from shard_utils.format import names

__all__ = [
    "SPLIT_DIRS", "SPLIT_ALIASES", "VIDEO_EXTENSIONS", "MEDIA_EXTENSIONS", "SYSTEM_NAMES", "SYSTEM_DIRS",
    "ExtraValues", "MediaItem", "skip_reason", "has_split_dirs", "split_and_label", "parse_splits",
    "usual_split_meant", "one_edit_apart", "Skip", "extension_of"
]

SPLIT_DIRS = ("train", "validation", "test")
SPLIT_ALIASES = {"valid": "validation", "val": "validation", "eval": "validation", "dev": "validation"}
VIDEO_EXTENSIONS = frozenset({".mp4", ".mov", ".webm", ".mkv", ".avi"})
MEDIA_EXTENSIONS = frozenset(
    {".jpg", ".jpeg", ".jpe", ".jfif", ".png", ".gif", ".webp", ".bmp", ".dib", ".tif", ".tiff",
     ".heic", ".heif", ".avif"})
SYSTEM_NAMES = frozenset({"thumbs.db", "desktop.ini", "ehthumbs.db", "icon\r"})
SYSTEM_DIRS = frozenset({"__macosx", "$recycle.bin", "system volume information"})


ExtraValues = tuple[int | float | str, ...]


@dataclass(frozen=True)
class MediaItem:
    """One media file to encode, however it was found (a folder walk or a listing row).

    `source_id` is the record's key (path relative to the input, or the path/URI as a listing gives it):
    it seeds the split and the order. `uri` is where the bytes are read. `origin` names where the item
    came from for messages (e.g. "train.csv row 17"); empty for a walked file. An item without a label has
    `labels` () and in `no_label` the (reason, message) of the rejection it becomes in a build that has labels;
    in a build where no item has one, it becomes an unlabeled record.
    """

    source_id: str
    uri: str
    size: int
    labels: tuple[str, ...]
    split: str | None = None
    extras: tuple[tuple[str, ExtraValues], ...] = ()
    origin: str = ""
    no_label: tuple[str, str] = ("", "")

    @property
    def label(self) -> str:
        """The first label (the only one in a single-label dataset); "" for an item without one."""
        return self.labels[0] if self.labels else ""


def skip_reason(rel_path: str, video: bool = False) -> str | None:
    """Why a file is skipped without being read ('hidden', 'system', 'not_media', and in a video build
    'still_image'), or None for media: still images, or video clips in a video build."""
    parts = rel_path.split("/")
    if any(p.startswith(".") for p in parts):
        return "hidden"
    if parts[-1].lower() in SYSTEM_NAMES or any(p.lower() in SYSTEM_DIRS for p in parts[:-1]):
        return "system"
    ext = extension_of(rel_path)
    if video:
        return None if ext in VIDEO_EXTENSIONS else "still_image" if ext in MEDIA_EXTENSIONS else "not_media"
    if ext not in MEDIA_EXTENSIONS:
        return "not_media"
    return None


def has_split_dirs(top_level_dirs: list[str]) -> bool:
    """True when the input's top-level folders are split folders (train/, validation/, test/)."""
    visible = [d for d in top_level_dirs if not d.startswith(".") and d.lower() not in SYSTEM_DIRS]
    return bool(visible) and all(d in SPLIT_DIRS for d in visible)


def split_and_label(rel_path: str, split_dirs: bool) -> tuple[str | None, str | None]:
    """(split from the folder or None, label folder name or None) of a media file."""
    parts = rel_path.split("/")
    if split_dirs:
        return parts[0], (parts[1] if len(parts) >= 3 else None)
    return None, (parts[0] if len(parts) >= 2 else None)


def parse_splits(text: str) -> list[tuple[str, float]]:
    """Parse `train=0.9,validation=0.1` into [(name, fraction)]; raises ValueError with a usable message."""
    out: list[tuple[str, float]] = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, sep, value = item.partition("=")
        name = name.strip()
        try:
            fraction = float(value)
        except ValueError:
            fraction = -1.0
        if not sep or not name or not (0 < fraction <= 1) or fraction != fraction:
            raise ValueError(f"--splits entry {item!r} must look like name=fraction with 0 < fraction <= 1")
        problem = names.split_name_problem(name) or names.generation_name_problem(name)
        if problem:
            raise ValueError(f"split name {names.shown(name)} {problem}")
        if name in (n for n, _ in out):
            raise ValueError(f"split {name!r} appears twice in --splits")
        out.append((name, fraction))
    if not out:
        raise ValueError("--splits is empty; expected e.g. train=0.9,validation=0.1")
    total = sum(f for _, f in out)
    if abs(total - 1.0) > 1e-6:
        raise ValueError(f"--splits fractions add up to {total:g}, not 1")
    return out


def usual_split_meant(name: str) -> str | None:
    """The usual split name (train, validation, test) a split name probably means but is not: one edit away
    (a letter added, dropped, changed, or two swapped; or only the case differs) or a common alias (valid, val,
    eval, dev); None for a usual name or one far from all. Split names stay free-form: this only feeds a note."""
    if name in SPLIT_DIRS:
        return None
    lower = name.lower()
    if lower in SPLIT_ALIASES:
        return SPLIT_ALIASES[lower]
    return next((usual for usual in SPLIT_DIRS if lower == usual or one_edit_apart(lower, usual)), None)


def one_edit_apart(a: str, b: str) -> bool:
    """Whether two different strings are one insertion, deletion, substitution or adjacent swap apart."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    i = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    if len(a) == len(b):
        swapped = a[i + 1:i + 2] + a[i:i + 1] == b[i:i + 2] and a[i + 2:] == b[i + 2:]
        return a[i + 1:] == b[i + 1:] or swapped
    longer, shorter = (a, b) if len(a) > len(b) else (b, a)
    return longer[i + 1:] == shorter[i:]


@dataclass(frozen=True)
class Skip:
    """A listed file that is not read: why, and its extension (for the summary)."""

    reason: str
    extension: str


def extension_of(rel_path: str) -> str:
    """The lower-case extension of a path's file name ('' when it has none)."""
    name = rel_path.rsplit("/", 1)[-1].lower()
    dot = name.rfind(".")
    return name[dot:] if dot > 0 else ""
