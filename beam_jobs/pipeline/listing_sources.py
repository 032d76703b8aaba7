"""Reading listings (CSV/TSV, JSONL, Avro; local or gs://) as Beam sources that stream, never whole in memory.

- CSV/TSV: one file is read by one worker, streamed row by row (a quoted field may hold line breaks, so
  a reader starting mid-file cannot tell where a row begins); row positions are exact line numbers.
- JSONL: split by byte ranges like Beam's text source; a row's position is the byte offset of its line.
- Avro: split at sync markers like Beam's `ReadFromAvro`, decoded by fastavro (arrays, nullable unions);
  a row's position is its block's byte offset and its number in the block.
Compressed CSV/JSONL (.gz, .bz2) are read whole, unsplit, and their offsets count decompressed bytes.
"""
from __future__ import annotations

import csv
import itertools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import BinaryIO

import apache_beam as beam
from apache_beam.io import filebasedsource
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_jobs import progress
from shard_utils import inputs, storage
from shard_utils.format import avro_blocks
from shard_utils.inputs import compressed, listing_files, listings
from shard_utils.inputs.listing_files import BOM, header_problem, json_row, lines, text_lines
from shard_utils.inputs.listings import ListingOptions, ListingRow

__all__ = [
    "ID_SAMPLE_ROWS", "ListingSource", "open_listing", "ReadListings", "read_all_rows", "ListingItems",
    "DropDuplicateRows", "match_listings", "pattern_format", "listing_columns", "prepare_listings",
    "ids_without_template"
]

ID_SAMPLE_ROWS = 20  # rows read at launch to tell a listing of ids from one of file paths


class ListingSource(filebasedsource.FileBasedSource):
    """Rows of the listing files matching a pattern, as ListingRow. Bad rows are rows with an `error`."""

    def __init__(self, pattern: str, fmt: str):
        super().__init__(pattern, compression_type=CompressionTypes.AUTO, splittable=fmt in ("jsonl", "avro"),
                         validate=False)
        self.fmt = fmt

    def read_records(self, file_name: str, range_tracker) -> Iterator[ListingRow]:
        with open_listing(file_name) as f:
            yield from listing_files.read_rows(f, file_name, self.fmt, range_tracker)


@contextmanager
def open_listing(uri: str) -> Iterator[BinaryIO]:
    """A listing file open for reading, decompressed (by its extension) a read at a time: Beam's own decompressing
    reader inflates 16 MB of input at once, which a decompression bomb turns into gigabytes."""
    with FileSystems.open(uri, compression_type=CompressionTypes.UNCOMPRESSED) as raw:
        with compressed.decompressed(raw, uri) as f:
            yield f


class ReadListings(beam.PTransform):
    """Every row of the listings matching `patterns` (local or gs:// files or globs), as ListingRow.

    Args:
      patterns: listing files or globs; each is one source.
      fmt: csv, tsv, jsonl or avro for all of them; None: from each pattern's (or its files') extension.
    Rows that cannot be parsed come out with `fields` None and an `error`; nothing is dropped.
    """

    def __init__(self, patterns: Sequence[str], fmt: str | None = None):
        super().__init__()
        self.patterns = list(patterns)
        self.fmt = fmt

    def expand(self, pbegin):
        reads = [pbegin | f"Read[{i}]" >> beam.io.Read(ListingSource(p, pattern_format(p, self.fmt)))
                 for i, p in enumerate(self.patterns)]
        return reads | "AllRows" >> beam.Flatten()


def read_all_rows(patterns: Sequence[str], fmt: str | None = None) -> Iterator[ListingRow]:
    """The listings' rows, read here in order and streamed (for checks at launch, which read the first few)."""
    for pattern in patterns:
        source = ListingSource(pattern, pattern_format(pattern, fmt))
        yield from source.read(source.get_range_tracker(None, None))


class ListingItems(beam.PTransform):
    """Listing rows as media items, keyed for de-duplication; rows that cannot be items go to `rejected`.

    Args:
      options: checked ListingOptions with the path column chosen (see `prepare_listings`).
      root: --input, the folder relative paths are under (None: only absolute paths are accepted).
    Main output `items`: (duplicate key, (row order, MediaItem)), ready for DropDuplicateRows;
    tagged `rejected`: rejected.jsonl dicts (bad_row, no_label).
    """

    def __init__(self, options: ListingOptions, root: str | None):
        super().__init__()
        self.options = options
        self.root = root

    def expand(self, pbegin):
        return (pbegin
                | "ReadListings" >> ReadListings(self.options.listings, self.options.format)
                | "RowToItem" >> beam.FlatMap(_row_to_item, self.options, self.root).with_outputs(
                    "rejected", main="items"))


def _row_to_item(row: ListingRow, options: ListingOptions, root: str | None):
    progress.advance("list")  # as the row is read, not once the listing is over
    out = listings.item_from_row(row, options, root)
    if isinstance(out, listings.Rejection):
        yield beam.pvalue.TaggedOutput("rejected", out.as_dict())
    else:
        yield listings.duplicate_key(out), (row.order, out)


class DropDuplicateRows(beam.PTransform):
    """Of rows naming the same file, keeps the first (by listing, position); the others go to `rejected`.

    Input: ListingItems' `items`. Main output `items`: MediaItem; tagged `rejected`: duplicate_row dicts.
    """

    def expand(self, keyed):
        return (keyed
                | "ByFile" >> beam.GroupByKey()
                | "KeepFirst" >> beam.FlatMap(_keep_first).with_outputs("rejected", main="items"))


def _keep_first(grouped):
    kept, duplicates = listings.pick_first(grouped[1])
    yield kept
    for rejection in duplicates:
        yield beam.pvalue.TaggedOutput("rejected", rejection.as_dict())


# ---- checks at launch (driver side) ---------------------------------------------------------------------------

def match_listings(patterns: Sequence[str]) -> dict[str, list[str]]:
    """The files each --listing pattern matches; raises ValueError if one matches none or two match one file."""
    matched: dict[str, list[str]] = {}
    owner: dict[str, str] = {}
    for pattern in patterns:
        try:
            files = sorted(m.path for m in FileSystems.match([pattern])[0].metadata_list)
        except Exception as exc:  # BeamIOError and storage errors: say which listing, in one line
            raise ValueError(f"--listing {pattern!r} cannot be listed: {_first_line(exc)}") from None
        if not files:
            raise ValueError(f"--listing {pattern!r} matches no file")
        for path in files:
            if path in owner:
                raise ValueError(f"listing {path} is matched by --listing {owner[path]!r} and {pattern!r}; "
                                 "its rows would be read twice")
            owner[path] = pattern
        matched[pattern] = files
    return matched


def pattern_format(pattern: str, forced: str | None = None, files: Sequence[str] | None = None) -> str:
    """The format of a listing pattern: forced, from its extension, or the one extension all its files share."""
    try:
        return listings.format_of(pattern, forced)
    except ValueError:
        if files is None:
            files = match_listings([pattern])[pattern]
        kinds = {listings.format_of(f) for f in files}
        if len(kinds) > 1:
            raise ValueError(f"--listing {pattern!r} matches files of several formats ({', '.join(sorted(kinds))}); "
                             "give one --listing per format") from None
        return kinds.pop()


def listing_columns(uri: str, fmt: str) -> list[str] | None:
    """The column names of a listing: the CSV/TSV header, the Avro record's fields, or the keys of the first
    JSONL row (None if it has no rows). Raises ValueError if the file cannot be read as that format."""
    try:
        with open_listing(uri) as f:
            if fmt == "avro":
                return _avro_fields(f, uri)
            if fmt == "jsonl":
                return _first_json_keys(f, uri)
            return _csv_header(f, uri, fmt)
    except compressed.CompressionError as exc:
        raise ValueError(f"listing {uri}: {exc}") from None
    except ValueError:
        raise
    except Exception as exc:
        raise ValueError(f"listing {uri} cannot be read: {_first_line(exc)}") from None


def _avro_fields(f, uri: str) -> list[str]:
    import fastavro

    try:
        schema = fastavro.reader(avro_blocks.Recent(f)).writer_schema  # a size in the header reads in chunks
    except Exception as exc:
        raise ValueError(f"listing {uri} is not an Avro file: {_first_line(exc)}") from None
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise ValueError(f"listing {uri} holds Avro values that are not records; its rows need named fields")
    return [field["name"] for field in schema["fields"]]


def _first_json_keys(f, uri: str) -> list[str] | None:
    for line in lines(f, uri):
        if line.strip(BOM + b" \t\r\n"):
            row = json_row(uri, 0, line.removeprefix(BOM))
            if row is None or row.fields is None:
                raise ValueError(f"listing {uri}: the first row {row.error if row else 'is empty'}")
            return list(row.fields)
    return None


def _csv_header(f, uri: str, fmt: str) -> list[str]:
    for fields in csv.reader(text_lines(f, uri), delimiter=listings.DELIMITERS[fmt]):
        if fields:
            header = [h.strip() for h in fields]
            problem = header_problem(header)
            if problem:
                raise ValueError(f"listing {uri}: {problem}")
            return header
    raise ValueError(f"listing {uri} is empty: a {fmt.upper()} listing starts with a header row")


def prepare_listings(options: ListingOptions) -> tuple[ListingOptions, list[str]]:
    """Check the listings before the job starts: each matches files, formats are known, the named columns
    exist (CSV/TSV headers and Avro schemas; JSONL rows are free-form). Returns the options with the path
    column chosen, and notes to print (which column was chosen). Raises ValueError with a one-line message.
    """
    notes: list[str] = []
    for pattern, files in match_listings(options.listings).items():
        fmt = pattern_format(pattern, options.format, files)
        columns = listing_columns(files[0], fmt)
        if options.path_column is None:
            if columns is None:
                raise ValueError(f"listing {files[0]} has no rows to find the path column in; give --path-column")
            column, note = listings.choose_path_column(columns, options, files[0])
            options = replace(options, path_column=column)
            notes += [note] if note else []
        if fmt != "jsonl":
            listings.check_columns(columns or [], options, files[0])
    return options, notes


def ids_without_template(options: ListingOptions, root: str | None) -> str | None:
    """Why the listing's paths look like ids, not files, or None. Without --path-template, when none of the
    first rows' paths has a media extension and none of them exists (Kaggle's train.csv holds ids: `id,label`),
    the build would end with every file missing: say so before any work, and what --path-template does."""
    if options.path_template is not None or options.path_column is None or not options.listings:
        return None
    try:
        rows = itertools.islice(read_all_rows(options.listings, options.format), ID_SAMPLE_ROWS)
        items = [i for i in (listings.item_from_row(r, options, root) for r in rows) if isinstance(i, inputs.MediaItem)]
    except Exception:  # noqa: BLE001 - a listing that cannot be read is reported where it is read
        return None
    if not items or any(inputs.extension_of(i.uri) in inputs.MEDIA_EXTENSIONS or storage.exists(i.uri)
                        for i in items):
        return None
    first = items[0]
    found = next((ext for ext in (".jpg", ".png", ".jpeg", ".webp") if storage.exists(first.uri + ext)), None)
    example = f"'{{}}{found}' ({first.uri}{found} exists)" if found else "'images/{}.jpg'"
    which = "" if len(items) == 1 else f", nor does any file its first {len(items)} rows name"
    return (f"listing {first.origin}: {first.uri} does not exist{which}, and no path has an image extension; if "
            f"column {options.path_column!r} holds ids, --path-template maps them to files, e.g. --path-template "
            f"{example}")


def _first_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:300]
