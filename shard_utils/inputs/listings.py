"""Listings (CSV, TSV, JSONL or Avro rows naming media files), labels from file names, extra columns.

Pure functions, no Beam: the options and their checks, the choice of the path column, path
resolution, typed extra values, and `item_from_row`, the one place where a row (or a walked file,
through `item_from_walk`) becomes a `MediaItem` or a `Rejection`. `beam_jobs.pipeline.listing_sources` reads the
files and calls these.
"""
from __future__ import annotations

import json
import math
import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from shard_utils import inputs, storage
from shard_utils.format import names, schema
from shard_utils.inputs import MediaItem

__all__ = [
    "FORMATS", "EXTENSIONS", "COMPRESSED", "DELIMITERS", "PATH_COLUMNS", "DEFAULT_LABEL_COLUMN",
    "DEFAULT_EXTRA_SEPARATOR", "EXTRA_TYPES", "FLOAT32_MAX", "INT64_RANGE", "NAME_TAKEN", "Rejection",
    "ListingOptions", "ListingRow", "add_arguments", "listing_options_from", "format_of", "check_name_pattern",
    "quoted", "parse_extra_columns", "choose_path_column", "check_columns", "item_from_row", "classify_entry",
    "item_from_walk", "unlabeled_item", "label_from_name", "labels_of", "check_split", "resolve_path", "extra_values",
    "duplicate_key", "pick_first", "missing"
]

FORMATS = ("csv", "tsv", "jsonl", "avro")
EXTENSIONS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl",
              ".avro": "avro"}
COMPRESSED = (".gz", ".bz2", ".deflate", ".zst", ".zstd", ".xz", ".lzma")  # Beam decompresses these (not Avro)
DELIMITERS = {"csv": ",", "tsv": "\t"}
PATH_COLUMNS = ("path", "image", "uri", "filename", "id")  # looked for in this order without --path-column
DEFAULT_LABEL_COLUMN = "label"
DEFAULT_EXTRA_SEPARATOR = " "  # a run of whitespace, as Kaggle's "haze primary" or "10 20 30 40"
EXTRA_TYPES = {"int64": "int64", "int": "int64", "float": "float32", "float32": "float32", "string": "string",
               "str": "string"}
FLOAT32_MAX = 3.4028234663852886e38
INT64_RANGE = (-(1 << 63), (1 << 63) - 1)
_EXTRA_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_ .-]*")
_INTEGER = re.compile(r"[+-]?\d+")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_DRIVE = re.compile(r"^[A-Za-z]:")

# Rejection reasons this module gives (rejected.jsonl "reason").
BAD_ROW, NO_LABEL, MISSING, DUPLICATE_ROW = "bad_row", "no_label", "missing", "duplicate_row"
NAME_TAKEN = "name_taken"  # a name that is not UTF-8 escapes to another file's name (walk.name_taken)


@dataclass(frozen=True)
class Rejection:
    """A row or file that cannot become a record: `source` is its path (or the row's origin), `reason` a category."""

    source: str
    reason: str
    message: str

    def as_dict(self) -> dict[str, str]:
        """The line written to rejected.jsonl."""
        return {"source": self.source, "reason": self.reason, "message": self.message}


@dataclass(frozen=True)
class ListingOptions:
    """What the listing options say, checked. Plain values, so it pickles to workers.

    `path_column` None means "not chosen yet": `choose_path_column` picks it from the listing's header.
    `label_column` None means labels come from file names (`label_from_name`).
    """

    listings: tuple[str, ...] = ()
    format: str | None = None  # forced format; None: each listing's extension decides
    path_column: str | None = None
    label_column: str | None = DEFAULT_LABEL_COLUMN
    split_column: str | None = None
    path_template: str | None = None
    extras: tuple[schema.ExtraSpec, ...] = ()
    extra_separator: str = DEFAULT_EXTRA_SEPARATOR
    label_separator: str | None = None
    label_from_name: str | None = None  # a regular expression with a named group `label`

    @property
    def multi_label(self) -> bool:
        """Whether rows may carry several labels (a separator was given; list columns are found only when read)."""
        return self.label_separator is not None


@dataclass(frozen=True)
class ListingRow:
    """One row as read from a listing: its columns, or why it could not be parsed, and where it was.

    `kind` says what `position` counts: "line" (CSV/TSV: (line where the row starts, 0), header = line 1),
    "byte" (JSONL: (byte offset of the line, 0)) or "block" (Avro: (byte offset of the block, record in it)).
    """

    listing: str
    kind: str
    position: tuple[int, int]
    fields: Mapping[str, Any] | None
    error: str | None = None

    @property
    def origin(self) -> str:
        """Where the row is, for messages: "train.csv line 18", "a.jsonl byte 5120", "b.avro block 4096 record 3"."""
        name = posixpath.basename(self.listing.rstrip("/")) or self.listing
        first, second = self.position
        if self.kind == "block":
            return f"{name} block {first} record {second}"
        return f"{name} {self.kind} {first}"

    @property
    def order(self) -> tuple[str, int, int]:
        """Sorts rows by listing file, then position: the first of duplicate rows is the one kept."""
        return (self.listing, *self.position)


# ---- options -------------------------------------------------------------------------------------------------

def add_arguments(parser) -> None:
    """Add the listing and label options to an argparse parser (all default None; see listing_options_from)."""
    g = parser.add_argument_group("listings and labels")
    g.add_argument("--listing", action="append", metavar="FILE_OR_GLOB",
                   help="CSV/TSV (with a header), JSONL or Avro file naming the media to read; local or gs://, "
                        "repeatable, globs allowed. Only the files it names are read")
    g.add_argument("--listing-format", choices=FORMATS, help="format of every --listing (default: from the extension)")
    g.add_argument("--path-column", help="column holding the path (default: the first of path, image, uri, "
                                         "filename, id)")
    g.add_argument("--label-column", help=f"column holding the label (default {DEFAULT_LABEL_COLUMN})")
    g.add_argument("--split-column", help="column holding each row's split (train, validation, ...)")
    g.add_argument("--path-template", help="turn the path column into a path, e.g. 'train_images/{}.jpg'")
    g.add_argument("--extra-columns", help="columns carried into records as extra/<name>: "
                                           "name[:int64|float|string][[]],... e.g. 'age:int64,bbox:float[]'")
    g.add_argument("--extra-separator", help="separator of list items in a CSV cell (default: whitespace)")
    g.add_argument("--label-separator", help="separator of several labels in one label cell (multi-label)")
    g.add_argument("--label-from-name", metavar="REGEX",
                   help=r"label from the file name by a regex with a group (?P<label>...), "
                        r"e.g. '^(?P<label>.+)_\d+\.\w+$'")


def listing_options_from(args: Any) -> ListingOptions:
    """Check the listing options of parsed arguments and gather them; raises ValueError naming the option."""
    get = lambda name: getattr(args, name, None)  # noqa: E731
    listings = tuple(get("listing") or ())
    needs_listing = ("listing_format", "path_column", "label_column", "split_column", "path_template",
                     "extra_columns", "extra_separator", "label_separator")
    for name in needs_listing:
        if get(name) is not None and not listings:
            raise ValueError(f"--{name.replace('_', '-')} needs --listing")
    fmt = get("listing_format")
    if fmt is not None and fmt not in FORMATS:
        raise ValueError(f"--listing-format {fmt!r} must be one of {', '.join(FORMATS)}")
    for listing in listings:
        format_of(listing, fmt)
    label_from_name = get("label_from_name")
    if label_from_name is not None:
        check_name_pattern(label_from_name)
        if get("label_column") is not None:
            raise ValueError("give --label-column or --label-from-name, not both")
        if get("label_separator") is not None:
            raise ValueError("--label-separator splits a label column; it cannot be used with --label-from-name")
    template = get("path_template")
    if template is not None and template.count("{}") != 1:
        raise ValueError(f"--path-template {template!r} must contain '{{}}' exactly once, where the id goes")
    for name in ("path_column", "label_column", "split_column"):
        if (column := get(name)) is not None and not column.strip():
            raise ValueError(f"--{name.replace('_', '-')} is empty")
    for name in ("extra_separator", "label_separator"):
        if get(name) is not None and get(name) == "":
            raise ValueError(f"--{name.replace('_', '-')} is empty; give the character(s) between items")
    return ListingOptions(
        listings=listings, format=fmt, path_column=get("path_column"),
        label_column=None if label_from_name is not None else (get("label_column") or DEFAULT_LABEL_COLUMN),
        split_column=get("split_column"), path_template=template,
        extras=parse_extra_columns(extras) if (extras := get("extra_columns")) is not None else (),
        extra_separator=get("extra_separator") or DEFAULT_EXTRA_SEPARATOR,
        label_separator=get("label_separator"), label_from_name=label_from_name)


def format_of(listing: str, forced: str | None = None) -> str:
    """The format of a listing (csv, tsv, jsonl or avro): `forced`, or from its extension (after .gz, .bz2)."""
    name = posixpath.basename(listing).lower()
    compressed = next((s for s in COMPRESSED if name.endswith(s)), "")
    stem = name[: len(name) - len(compressed)]
    fmt = forced or EXTENSIONS.get(posixpath.splitext(stem)[1])
    if fmt is None:
        raise ValueError(f"--listing {listing!r}: cannot tell its format from the name; use one of "
                         f"{', '.join(sorted(EXTENSIONS))} or --listing-format {'|'.join(FORMATS)}")
    if fmt == "avro" and compressed:
        raise ValueError(f"--listing {listing!r}: an Avro file compresses its own blocks; give it uncompressed")
    return fmt


def check_name_pattern(pattern: str) -> re.Pattern:
    """Compile a --label-from-name regex; raises ValueError if it does not compile or has no group `label`."""
    try:
        compiled = _compile(pattern)
    except re.error as exc:
        raise ValueError(f"--label-from-name {quoted(pattern)} is not a valid regular expression: {exc}") from None
    if "label" not in compiled.groupindex:
        raise ValueError(f"--label-from-name {quoted(pattern)} has no named group (?P<label>...) saying which part "
                         "is the label")
    return compiled


def quoted(pattern: str) -> str:
    """A regex as the user typed it, in quotes (repr() would double every backslash)."""
    return f'"{pattern}"' if "'" in pattern else f"'{pattern}'"


@lru_cache(maxsize=16)
def _compile(pattern: str) -> re.Pattern:
    return re.compile(pattern)


def parse_extra_columns(text: str) -> tuple[schema.ExtraSpec, ...]:
    """Parse `age:int64,bbox:float[],note` into ExtraSpecs (type string by default, `[]` for a list)."""
    specs: list[schema.ExtraSpec] = []
    for entry in filter(None, (e.strip() for e in text.split(","))):
        name, _, kind = (p.strip() for p in entry.partition(":"))
        is_list = (kind or name).endswith("[]")
        if is_list:
            name, kind = (name[:-2].strip(), kind) if not kind else (name, kind[:-2].strip())
        dtype = EXTRA_TYPES.get((kind or "string").lower())
        if dtype is None:
            raise ValueError(f"--extra-columns entry {entry!r}: type {kind!r} is not int64, float or string")
        if not _EXTRA_NAME.fullmatch(name):
            raise ValueError(f"--extra-columns entry {entry!r}: a column name may use letters, digits, spaces and "
                             "_ . - (and must start with a letter, digit or _)")
        if any(s.name == name for s in specs):
            raise ValueError(f"--extra-columns names {name!r} twice")
        specs.append(schema.ExtraSpec(name, dtype, is_list))
    if not specs:
        raise ValueError("--extra-columns is empty; expected e.g. 'age:int64,bbox:float[]'")
    return tuple(specs)


def choose_path_column(columns: Sequence[str], options: ListingOptions, listing: str) -> tuple[str, str | None]:
    """The column holding paths, and a note saying which was chosen when it was not named by --path-column.

    Raises ValueError when the named column, or every usual one, is missing.
    """
    if options.path_column is not None:
        if options.path_column not in columns:
            raise ValueError(f"listing {listing} has no column {options.path_column!r} (--path-column); "
                             f"its columns are {_names(columns)}")
        return _only_paths(options.path_column, options, listing), None
    for name in PATH_COLUMNS:
        if name in columns:
            return (_only_paths(name, options, listing),
                    f"listing {listing}: paths from column {name!r} (set --path-column to choose another)")
    raise ValueError(f"listing {listing} has none of the columns {', '.join(PATH_COLUMNS)}; name the one holding "
                     f"paths with --path-column (its columns are {_names(columns)})")


def _only_paths(column: str, options: ListingOptions, listing: str) -> str:
    """The path column, refused (ValueError) when the label or split is also to be read from it."""
    for other, option in ((options.label_column, "--label-column"), (options.split_column, "--split-column")):
        if other == column:
            raise ValueError(f"listing {listing}: column {column!r} holds the paths and cannot also be the {option}; "
                             "name another column")
    return column


def check_columns(columns: Sequence[str], options: ListingOptions, listing: str) -> None:
    """Refuse a listing whose header lacks a column the options name (label, split, extras)."""
    named = [(options.path_column, "--path-column"), (options.label_column, "--label-column"),
             (options.split_column, "--split-column")] + [(s.name, "--extra-columns") for s in options.extras]
    for column, option in named:
        if column is not None and column not in columns:
            hint = " or take labels from file names with --label-from-name" if option == "--label-column" else ""
            raise ValueError(f"listing {listing} has no column {column!r} ({option}{hint}); "
                             f"its columns are {_names(columns)}")
    if options.path_column is not None:
        _only_paths(options.path_column, options, listing)


def _names(columns: Sequence[str]) -> str:
    shown = ", ".join(repr(c) for c in list(columns)[:12])
    return (shown + ", ...") if len(columns) > 12 else (shown or "none")


# ---- rows and walked files into media items ------------------------------------------------------------------

def item_from_row(row: ListingRow, options: ListingOptions, root: str | None) -> MediaItem | Rejection:
    """A listing row as the media item it names, or why it cannot be one (bad_row, no_label).

    Paths are relative to `root` (--input) or absolute (a local path, or gs:// in any bucket). The item's
    size is 0: the listing does not say it; the reader learns it when it opens the file.
    """
    origin = row.origin
    if row.fields is None:
        return Rejection(origin, BAD_ROW, f"{origin}: {row.error or 'unreadable row'}")
    if options.path_column is None:
        raise ValueError("ListingOptions.path_column is not chosen; call choose_path_column first")
    fields = row.fields
    try:
        raw_path = _text(_column(fields, options.path_column), options.path_column, file_name=True)
        if options.path_template is not None:
            raw_path = options.path_template.replace("{}", raw_path)
        source_id, uri = resolve_path(raw_path, root)
    except ValueError as exc:
        return Rejection(origin, BAD_ROW, f"{origin}: {exc}")
    try:
        given = None if options.label_column is None else _column(fields, options.label_column)
        split = None
        if options.split_column is not None:
            split = check_split(_text(_column(fields, options.split_column), options.split_column))
        extras = tuple((spec.name, extra_values(spec, _column(fields, spec.name), options.extra_separator))
                       for spec in options.extras)
    except ValueError as exc:
        return Rejection(source_id, BAD_ROW, f"{origin}: {exc}")
    return _item(source_id, uri, 0, given, options.label_column, split, extras, options, origin)


def classify_entry(entry: storage.Entry, split_dirs: bool, root: str, options: ListingOptions,
                   video: bool = False) -> MediaItem | inputs.Skip | Rejection:
    """A walked entry as a media item, a skip (not read, counted), or a rejection with a reason."""
    rel = names.escaped_name(entry.rel_path)
    skip = inputs.skip_reason(rel.rstrip("/"), video)
    if entry.reason is not None and skip not in ("hidden", "system"):
        # A link or folder we cannot read may hold images: say so rather than skip it quietly.
        return Rejection(rel, entry.reason, entry.message or entry.reason)
    if skip is not None:
        return inputs.Skip(skip, inputs.extension_of(rel))
    return item_from_walk(entry.rel_path, entry.size, root, split_dirs, options)


def item_from_walk(rel_path: str, size: int, root: str, split_dirs: bool,
                   options: ListingOptions) -> MediaItem | Rejection:
    """A walked media file as an item: label from its folder, or from its name with --label-from-name. A name
    that is not UTF-8 is read where it is and known by its escaped form (names.escaped_name)."""
    source_id = names.escaped_name(rel_path)
    split, folder_label = inputs.split_and_label(source_id, split_dirs)
    if folder_label is None and options.label_from_name is None:
        where = "its split folder" if split_dirs else "the input folder"
        return unlabeled_item(source_id, storage.join(root, rel_path), size, split, (), "",
                              (NO_LABEL, f"file sits directly in {where}, not in a label folder"))
    return _item(source_id, storage.join(root, rel_path), size, folder_label, None, split, (), options, "")


def _item(source_id: str, uri: str, size: int, given: Any, column: str | None, split: str | None,
          extras: tuple, options: ListingOptions, origin: str) -> MediaItem | Rejection:
    """The shared last step: labels (given, or from the file name), then the item."""
    where = f"{origin}: " if origin else ""
    if options.label_from_name is not None:
        name = posixpath.basename(source_id)
        label = label_from_name(name, options.label_from_name)
        if label is None:
            return Rejection(source_id, NO_LABEL, f"{where}file name {name!r} does not match --label-from-name "
                                                  f"{quoted(options.label_from_name)} (or its label group is empty)")
        labels: tuple[str, ...] = (label,)
    else:
        try:
            labels = labels_of(given, options.label_separator, column or "label")
        except ValueError as exc:
            return Rejection(source_id, BAD_ROW, f"{where}{exc}")
        if not labels:
            return unlabeled_item(source_id, uri, size, split, extras, origin,
                                  (BAD_ROW, f"empty label in column {column or 'label'!r}"))
    return MediaItem(source_id=source_id, uri=uri, size=size, labels=labels, split=split, extras=extras,
                     origin=origin)


def unlabeled_item(source_id: str, uri: str, size: int, split: str | None, extras: tuple, origin: str,
                   why: tuple[str, str]) -> MediaItem:
    """An item without a label: an unlabeled record in a build where no item has one, else rejected as `why` says
    (encode.encode_item decides, once the build's labels are known)."""
    return MediaItem(source_id=source_id, uri=uri, size=size, labels=(), split=split, extras=extras, origin=origin,
                     no_label=why)


def label_from_name(name: str, pattern: str) -> str | None:
    """The `label` group of the pattern searched in a file name, or None if it does not match or is empty."""
    found = _compile(pattern).search(name)
    label = found.group("label") if found else None
    return label or None


def labels_of(value: Any, separator: str | None, column: str = "label") -> tuple[str, ...]:
    """The labels in a cell: a list (JSONL/Avro), or text split by `separator`; () when there is none (an empty
    cell, an empty list, a JSON null); raises ValueError if a label holds a line break.

    Surrounding whitespace is dropped, empty pieces skipped, repeats kept once (first order kept).
    """
    if isinstance(value, (list, tuple)):
        pieces = [_text(v, column) for v in value]
    elif value is None:
        pieces = []
    else:
        text = _text(value, column)
        pieces = text.split() if separator == " " else text.split(separator) if separator else [text]
    labels = tuple(dict.fromkeys(p.strip() for p in pieces if p.strip()))
    for label in labels:
        if "\n" in label or "\r" in label:
            raise ValueError(f"the label in column {column!r} holds a line break (an unclosed quote in the listing?)")
    return labels


def check_split(name: str) -> str:
    """A split name from a listing, checked as --splits checks names; raises ValueError."""
    return _check_split(name.strip())


@lru_cache(maxsize=64)
def _check_split(name: str) -> str:
    if not name:
        raise ValueError("empty split")
    try:
        inputs.parse_splits(f"{name}=1")  # one rule for split names, wherever they come from
    except ValueError as exc:
        raise ValueError(str(exc)) from None
    return name


def resolve_path(value: str, root: str | None) -> tuple[str, str]:
    """(source_id, uri) of a path as a listing gives it; raises ValueError saying what is wrong with it.

    gs://bucket/name (any bucket) and absolute local paths are used as given; relative paths are
    under `root`, with `./` and doubled slashes dropped (under a gs:// root a doubled slash is refused: it
    names another object); `..`, backslashes, Windows drives and other URL schemes are refused.
    """
    path = value.strip()
    if not path:
        raise ValueError("empty path")
    if "\n" in path or "\r" in path:
        raise ValueError(f"path {_short(path)} holds a line break (an unclosed quote in the listing?)")
    if "\x00" in path:
        raise ValueError(f"path {_short(path)} holds a NUL character, which no file name can")
    if "\\" in path:
        raise ValueError(f"path {_short(path)} uses '\\'; write paths with '/' (a '\\' inside a file name is not "
                         "supported)")
    if _SCHEME.match(path):
        if not storage.is_gcs(path):
            raise ValueError(f"path {_short(path)}: only gs:// URIs and local paths can be read")
        bucket, name = path[len(storage.GCS):].partition("/")[::2]
        if not bucket or not name or name.endswith("/"):
            raise ValueError(f"path {_short(path)} must name an object: gs://bucket/name")
        problem = names.gcs_name_problem(path)
        if problem:
            raise ValueError(f"path {_short(path)} {problem}")
        _check_utf8(path, f"path {_short(path)}", "; a gs:// object name always is")
        return path, path
    if _DRIVE.match(path):
        raise ValueError(f"path {_short(path)} is a Windows path; give it relative to --input, or as a "
                         "local absolute path with '/'")
    if path.endswith("/"):
        raise ValueError(f"path {_short(path)} names a folder, not a file")
    if path.startswith("/"):
        normal = posixpath.normpath(path)
        return _named(normal, path), normal
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ValueError(f"path {_short(path)} climbs out of --input with '..'; give it as an absolute path")
    if root is None:
        raise ValueError(f"path {_short(path)} is relative and there is no --input to read it from")
    rel = "/".join(parts)
    if storage.is_gcs(root):
        if "//" in path:  # an object's name keeps '//': a//b.jpg is not a/b.jpg there, nor readable by this job
            raise ValueError(f"path {_short(path)} has an empty part ('//'): on gs:// it names another object than "
                             f"{_short(rel)}, which tpu-shards does not read; write {_short(rel)} if that one is meant")
        _check_utf8(rel, f"path {_short(path)}", "; a gs:// object name always is")
        return rel, root.rstrip("/") + "/" + rel
    return _named(rel, path), storage.join(root, rel)


def _named(path: str, given: str) -> str:
    """The source id of a local path: the path, escaped if its name is not UTF-8 (names.escaped_name)."""
    try:
        return names.escaped_name(path)
    except ValueError as exc:
        raise ValueError(f"path {_short(given)} {exc}") from None


def extra_values(spec: schema.ExtraSpec, value: Any, separator: str = DEFAULT_EXTRA_SEPARATOR) -> inputs.ExtraValues:
    """A cell's typed values for an extra column; raises ValueError naming the column and the value.

    A list column takes a list (JSONL/Avro), a JSON array written in a cell ("[1, 2]"), or text split by
    `separator` (whitespace by default); a scalar column takes exactly one value.
    """
    if spec.is_list:
        if value is None:
            return ()
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("[") and text.endswith("]"):
                try:
                    value = json.loads(text)
                except ValueError:
                    raise ValueError(f"column {spec.name!r}: {_short(text)} is not a JSON array") from None
            else:
                value = text.split() if separator == " " else [p.strip() for p in text.split(separator)] if text else []
        items = value if isinstance(value, (list, tuple)) else [value]
        return tuple(_typed(spec, v) for v in items)
    if isinstance(value, (list, tuple)):
        raise ValueError(f"column {spec.name!r} holds a list; declare it as {spec.name}:"
                         f"{_TYPE_NAMES[spec.dtype]}[] in --extra-columns")
    if value is None:
        raise ValueError(f"column {spec.name!r} has no value")
    return (_typed(spec, value),)


_TYPE_NAMES = {"int64": "int64", "float32": "float", "string": "string"}


def _typed(spec: schema.ExtraSpec, value: Any) -> schema.ExtraValue:
    where = f"column {spec.name!r}:"
    if isinstance(value, (dict, list, tuple)) or value is None:
        raise ValueError(f"{where} {_short(json.dumps(value, default=str))} is not a single {spec.dtype} value")
    if spec.dtype == "string":
        if isinstance(value, bytes):
            try:
                return value.decode("utf-8")
            except UnicodeDecodeError:
                raise ValueError(f"{where} bytes that are not UTF-8 text") from None
        if isinstance(value, str):
            _check_utf8(value, f"column {spec.name!r}")
            return value
        return json.dumps(value) if isinstance(value, (bool, int, float)) else str(value)
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{where} {_short(str(value))} is not a number")
    if spec.dtype == "int64":
        if isinstance(value, float) or (isinstance(value, str) and not _INTEGER.fullmatch(value.strip())):
            raise ValueError(f"{where} {_short(str(value))} is not an integer (int64)")
        integer = int(value)
        if not INT64_RANGE[0] <= integer <= INT64_RANGE[1]:
            raise ValueError(f"{where} {integer} does not fit in int64")
        return integer
    try:
        number = float(value.strip() if isinstance(value, str) else value)
    except ValueError:
        raise ValueError(f"{where} {_short(str(value))} is not a number (float)") from None
    if not math.isfinite(number) or abs(number) > FLOAT32_MAX:
        raise ValueError(f"{where} {_short(str(value))} is not a finite float32")
    return number


def _column(fields: Mapping[str, Any], column: str) -> Any:
    if column not in fields:
        raise ValueError(f"no column {column!r}")
    return fields[column]


def _text(value: Any, column: str, file_name: bool = False) -> str:
    """A cell as text: strings as they are, integers written out; anything else is refused, and so is text
    that is not UTF-8 unless the cell names a file (a file name may be any bytes; see names.escaped_name)."""
    if isinstance(value, str):
        if not file_name:
            _check_utf8(value, f"column {column!r}")
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    shown = "empty" if value is None else _short(json.dumps(value, default=str))
    raise ValueError(f"column {column!r} is {shown}, not text")


def _check_utf8(text: str, where: str, why: str = "") -> None:
    """Refuse text holding bytes that are not UTF-8 (surrogate escapes from a CSV cell or a JSON "\\udcff")."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{where} is not UTF-8 text{why}") from None


def _short(text: str, limit: int = 120) -> str:
    text = text if len(text) <= limit else text[:limit] + "..."
    return repr(text)


# ---- duplicates and missing files ----------------------------------------------------------------------------

def duplicate_key(item: MediaItem) -> str:
    """Rows naming the same file are duplicates: the key is the file's uri (escaped, so two files whose names
    escape alike are duplicates too: they would share a source id)."""
    return names.escaped_name(item.uri)


def pick_first(rows: Iterable[tuple[tuple[str, int, int], MediaItem]]) -> tuple[MediaItem, list[Rejection]]:
    """Of rows naming one file, as (ListingRow.order, item): keep the first by (listing, position); reject the rest.

    Rows naming different files whose names escape alike (one name is not UTF-8): as in a folder walk, the file
    whose name is its source id is kept, the other rejected `name_taken`."""
    ordered = sorted(rows, key=lambda r: (r[1].uri != duplicate_key(r[1]), r[0]))
    if not ordered:
        raise ValueError("pick_first needs at least one row")
    kept = ordered[0][1]
    return kept, [Rejection(item.source_id, DUPLICATE_ROW, f"{item.origin}: {item.uri} is listed again; "
                                                            f"the row at {kept.origin} is kept")
                  if item.uri == kept.uri else
                  Rejection(item.source_id, NAME_TAKEN, f"{item.origin}: the file name is not UTF-8 and its escaped "
                                                         f"form {item.source_id} names the file of the row at "
                                                         f"{kept.origin}; rename one of them")
                  for _, item in ordered[1:]]


def missing(item: MediaItem) -> Rejection:
    """The rejection of an item whose file does not exist."""
    where = f"{item.origin}: " if item.origin else ""
    return Rejection(item.source_id, MISSING, f"{where}{names.escaped_name(item.uri)} does not exist")
