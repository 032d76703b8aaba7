"""Listing files (CSV/TSV, JSONL, Avro) parsed into rows, from an open binary file: what the Beam sources
(beam_jobs.pipeline.listing_sources) read in byte ranges, and what a local build's worker reads whole, without Beam.

Each reader takes a range tracker (Beam's, or WHOLE_FILE) and yields ListingRow; a row that cannot be
parsed comes with `fields` None and an `error`, so nothing is dropped. A file that cannot be read to its end
(an unclosed quote, a damaged Avro block) raises ListingError: the rows after the damage would be lost.
"""
from __future__ import annotations

import csv
import json
from contextlib import contextmanager
from typing import Iterator

from shard_utils import storage
from shard_utils.inputs import listings
from shard_utils.inputs.listings import ListingRow

BOM = b"\xef\xbb\xbf"
SYNC_SIZE = 16  # bytes of an Avro sync marker
# Fed to the CSV parser after the file's last line: it ends up inside a field only when the file ends inside a
# quoted field (decoded text never holds a lone high surrogate: bad UTF-8 becomes U+DC80..U+DCFF).
_END = "\ud800"


class ListingError(ValueError):
    """A listing file cannot be read to its end; the message names the file and where the reading stopped."""


class _WholeFile:
    """A range tracker for reading a file whole: every position is claimed."""

    @staticmethod
    def start_position() -> int:
        return 0

    @staticmethod
    def try_claim(position: int) -> bool:
        return True


WHOLE_FILE = _WholeFile()


def read_rows(f, name: str, fmt: str, tracker=WHOLE_FILE) -> Iterator[ListingRow]:
    """The rows of listing file `name` (format `fmt`) in the tracker's range, from its open binary file."""
    read = {"csv": _read_csv, "tsv": _read_csv, "jsonl": _read_jsonl, "avro": _read_avro}[fmt]
    yield from read(f, name, tracker, fmt)


def lines(f) -> Iterator[bytes]:
    return iter(f.readline, b"")


def _read_csv(f, name: str, tracker, fmt: str) -> Iterator[ListingRow]:
    if not tracker.try_claim(tracker.start_position() or 0):
        return
    reader = csv.reader(_then_end(text_lines(f)), delimiter=listings.DELIMITERS[fmt])
    header: list[str] | None = None
    start = 1
    try:
        for fields in reader:
            if fields == [_END]:
                return
            _check_closed(name, start, reader.line_num, fields, header)
            if not fields:  # a blank line is no row
                start = reader.line_num + 1
                continue
            if header is None:
                header = [h.strip() for h in fields]
                problem = header_problem(header)
                if problem:
                    yield ListingRow(name, "line", (start, 0), None, problem + "; the listing is not read")
                    return
            else:
                yield _csv_row(name, start, header, fields)
            start = reader.line_num + 1
    except csv.Error as exc:
        raise ListingError(f"listing {name} line {start}: not readable as {fmt.upper()} ({exc}); the lines after it "
                           "cannot be read") from None


def _then_end(lines_: Iterator[str]) -> Iterator[str]:
    yield from lines_
    yield _END + "\n"


def _check_closed(name: str, start: int, end: int, fields: list[str], header: list[str] | None) -> None:
    """Refuse a row that swallowed the lines after it: one whose quoted field runs to the end of the file, or
    that runs over several lines and then does not fit the header (a quote closed by a later line's quote)."""
    if any(_END in field for field in fields):
        raise ListingError(f"listing {name} line {start}: a quoted field is never closed, so every line after it "
                           "would be read into it; close the quote (a quote inside a quoted field is written \"\")")
    if header is not None and end > start and len(fields) != len(header):
        raise ListingError(f"listing {name} lines {start}..{end}: a quoted field runs over {end - start + 1} lines "
                           f"and leaves a row of {len(fields)} fields, the header has {len(header)}: an unclosed "
                           "quote? The lines it swallowed would be lost")


def text_lines(f) -> Iterator[str]:
    """Lines as text with their line ends (what csv needs for quoted line breaks); bad UTF-8 kept as escapes."""
    first = True
    for line in lines(f):
        if first:
            line, first = line.removeprefix(BOM), False
        yield line.decode("utf-8", "surrogateescape")


def header_problem(header: list[str]) -> str | None:
    if len(set(header)) != len(header):
        twice = sorted({h for h in header if header.count(h) > 1})
        return f"the header names column {twice[0]!r} twice"
    return None


def _csv_row(name: str, start: int, header: list[str], fields: list[str]) -> ListingRow:
    where = (start, 0)
    if len(fields) != len(header):
        return ListingRow(name, "line", where, None, f"has {len(fields)} fields, the header {len(header)}")
    # A cell that is not UTF-8 keeps its bytes as surrogate escapes: a path cell may name a file whose name is
    # not UTF-8 (listings.resolve_path), every other cell is refused when it is used (listings._text).
    return ListingRow(name, "line", where, dict(zip(header, fields)))


def _read_jsonl(f, name: str, tracker, fmt: str) -> Iterator[ListingRow]:
    start = tracker.start_position() or 0
    position = 0
    if start > 0:  # a line starting before `start` belongs to the range before
        f.seek(start - 1)
        position = start - 1 + len(f.readline())
    while tracker.try_claim(position):
        line = f.readline()
        if not line:
            return
        row = json_row(name, position, line.removeprefix(BOM) if position == 0 else line)
        position += len(line)
        if row is not None:
            yield row


def json_row(name: str, position: int, line: bytes) -> ListingRow | None:
    where = (position, 0)
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return ListingRow(name, "byte", where, None, "is not UTF-8 text")
    if not text.strip():
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        return ListingRow(name, "byte", where, None, f"is not JSON ({exc})")
    except RecursionError:
        return ListingRow(name, "byte", where, None, "is not JSON this reader can take (nested too deeply)")
    if not isinstance(value, dict):
        return ListingRow(name, "byte", where, None, f"is a JSON {type(value).__name__}, not an object")
    return ListingRow(name, "byte", where, value)


def _read_avro(f, name: str, tracker, fmt: str) -> Iterator[ListingRow]:
    import fastavro

    f = _ChunkedReads(f)
    try:
        blocks = fastavro.block_reader(f)
    except Exception as exc:  # fastavro raises many types for a bad header
        raise ListingError(f"listing {name} is not a readable Avro file: {storage.problem(exc)}") from None
    header_end = f.tell()
    f.seek(header_end - SYNC_SIZE)
    sync = f.read(SYNC_SIZE)
    start = tracker.start_position() or 0
    next_block = header_end if start <= header_end else _after_sync(f, start - SYNC_SIZE, sync)
    if next_block is None:
        return
    f.seek(next_block)
    while tracker.try_claim(next_block):
        with _damaged_block(name, next_block):
            block = next(blocks, None)
            if block is None:
                return
            for number, record in enumerate(block, start=1):
                if isinstance(record, dict):
                    yield ListingRow(name, "block", (block.offset, number), record)
                else:
                    yield ListingRow(name, "block", (block.offset, number), None, "is not an Avro record")
        next_block = block.offset + block.size


@contextmanager
def _damaged_block(name: str, offset: int) -> Iterator[None]:
    """A failure reading the Avro block at offset, as a ListingError (fastavro raises many types)."""
    try:
        yield
    except Exception as exc:
        raise ListingError(f"listing {name}: the Avro block at byte {offset} is damaged ({storage.problem(exc)}); "
                           "the records from it on cannot be read") from None


class _ChunkedReads:
    """A file whose large reads go in chunks (see storage.read_in_chunks): an Avro block's declared size is
    then bounded by what the file holds."""

    def __init__(self, f):
        self._f = f

    def read(self, n: int = -1) -> bytes:
        return self._f.read(n) if n is None or n < 0 else storage.read_in_chunks(self._f.read, n)

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._f.seek(offset, whence)

    def tell(self) -> int:
        return self._f.tell()


def _after_sync(f, offset: int, sync: bytes, chunk: int = 1 << 16) -> int | None:
    """The position just after the first sync marker at or after `offset`, or None at the end of the file."""
    f.seek(offset)
    carried = b""
    base = offset
    while True:
        data = f.read(chunk)
        if not data:
            return None
        window = carried + data
        found = window.find(sync)
        if found >= 0:
            return base + found + SYNC_SIZE
        carried = window[-(SYNC_SIZE - 1):]
        base += len(window) - len(carried)
