"""Listing files (CSV/TSV, JSONL, Avro) parsed into rows, from an open binary file: what the Beam sources
(beam_jobs.pipeline.listing_sources) read in byte ranges, and what a local build's worker reads whole, without Beam.

Each reader takes a range tracker (Beam's, or WHOLE_FILE) and yields ListingRow; a row that cannot be
parsed comes with `fields` None and an `error`, so nothing is dropped. A file that cannot be read to its end
(an unclosed quote, a damaged Avro block) raises ListingError: the rows after the damage would be lost.
"""
from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from contextlib import contextmanager

from shard_utils import storage
from shard_utils.errors import TpuShardsError
from shard_utils.format import avro_blocks
from shard_utils.format.avro_blocks import SYNC_SIZE
from shard_utils.inputs import listings
from shard_utils.inputs.compressed import CompressionError
from shard_utils.inputs.listings import ListingRow

__all__ = [
    "BOM", "MAX_LINE", "ListingError", "WHOLE_FILE", "read_rows", "read_line", "lines", "text_lines", "header_problem",
    "json_row"
]

BOM = b"\xef\xbb\xbf"
MAX_LINE = 4 * 2**20  # bytes in one line of a CSV/TSV or JSONL listing, and in one CSV row with its line breaks
# Fed to the CSV parser after the file's last line: it ends up inside a field only when the file ends inside a
# quoted field (decoded text never holds a lone high surrogate: bad UTF-8 becomes U+DC80..U+DCFF).
_END = "\ud800"


class ListingError(ValueError, TpuShardsError):
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
    """The rows of listing file `name` (format `fmt`) in the tracker's range, from its open binary file (opened
    through `compressed.decompressed` when it is compressed)."""
    read = {"csv": _read_csv, "tsv": _read_csv, "jsonl": _read_jsonl, "avro": _read_avro}[fmt]
    try:
        yield from read(f, name, tracker, fmt)
    except CompressionError as exc:
        raise ListingError(f"listing {name}: {exc}; the rows after it cannot be read") from None


def read_line(f, name: str, where: str) -> bytes:
    """The next line (b"" at the end), refused past MAX_LINE bytes before more is read: a decompression bomb or
    a file that is no listing may hold gigabytes without a line break."""
    line = f.readline(MAX_LINE + 1)
    if len(line) > MAX_LINE:
        raise ListingError(f"listing {name} {where}: a line longer than {MAX_LINE} bytes; the rows from it on "
                           "cannot be read")
    return line


def lines(f, name: str, row: list[int] | None = None) -> Iterator[bytes]:
    """The lines of a listing, each at most MAX_LINE bytes. `row`, when given, is [bytes of the CSV row being
    read], which its reader zeroes after each row: a row (quoted line breaks and all) is held to MAX_LINE too."""
    number = 0
    while line := read_line(f, name, f"line {number + 1}"):
        number += 1
        if row is not None:
            row[0] += len(line)
            if row[0] > MAX_LINE:
                raise ListingError(f"listing {name} line {number}: a row longer than {MAX_LINE} bytes (its quoted "
                                   "fields run over many lines); the rows from it on cannot be read")
        yield line


def _read_csv(f, name: str, tracker, fmt: str) -> Iterator[ListingRow]:
    if not tracker.try_claim(tracker.start_position() or 0):
        return
    row = [0]
    reader = csv.reader(_then_end(text_lines(f, name, row)), delimiter=listings.DELIMITERS[fmt])
    header: list[str] | None = None
    start = 1
    try:
        for fields in reader:
            row[0] = 0
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


def text_lines(f, name: str, row: list[int] | None = None) -> Iterator[str]:
    """Lines as text with their line ends (what csv needs for quoted line breaks); bad UTF-8 kept as escapes."""
    first = True
    for line in lines(f, name, row):
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
    return ListingRow(name, "line", where, dict(zip(header, fields, strict=True)))


def _read_jsonl(f, name: str, tracker, fmt: str) -> Iterator[ListingRow]:
    start = tracker.start_position() or 0
    position = 0
    if start > 0:  # a line starting before `start` belongs to the range before
        f.seek(start - 1)
        position = start - 1 + len(read_line(f, name, f"byte {start - 1}"))
    while tracker.try_claim(position):
        line = read_line(f, name, f"byte {position}")
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

    stream = avro_blocks.Recent(f)
    try:
        header = fastavro.block_reader(stream)  # reads the header only; blocks are framed here, with bounds
        schema, codec = fastavro.parse_schema(header.writer_schema), header.metadata.get("avro.codec", "null")
    except Exception as exc:  # fastavro raises many types for a bad header
        raise ListingError(f"listing {name} is not a readable Avro file: {storage.problem(exc)}") from None
    if codec not in avro_blocks.CODECS:
        raise ListingError(f"listing {name} is compressed with {codec!r}; Avro listings may use "
                           f"{', '.join(avro_blocks.CODECS)}")
    header_end, sync = f.tell(), stream.tail
    start = tracker.start_position() or 0
    next_block = header_end if start <= header_end else _after_sync(f, start - SYNC_SIZE, sync)
    if next_block is None:
        return
    f.seek(next_block)
    while tracker.try_claim(next_block):
        with _damaged_block(name, next_block):
            framed = avro_blocks.block_header(stream)
            if framed is None:
                return
            count, size = framed
            rows = io.BytesIO(avro_blocks.block_body(stream, size, codec, sync))
            if count > len(rows.getbuffer()):  # a listing's row holds a path: at least one byte
                raise avro_blocks.BlockError(f"a block declares {count} rows in {len(rows.getbuffer())} bytes")
            for number in range(1, count + 1):
                record = fastavro.schemaless_reader(rows, schema, None)
                if isinstance(record, dict):
                    yield ListingRow(name, "block", (next_block, number), record)
                else:
                    yield ListingRow(name, "block", (next_block, number), None, "is not an Avro record")
            if rows.tell() != len(rows.getbuffer()):
                raise avro_blocks.BlockError(f"the block holds bytes after its {count} rows")
        next_block = f.tell()


@contextmanager
def _damaged_block(name: str, offset: int) -> Iterator[None]:
    """A failure reading the Avro block at offset, as a ListingError (fastavro raises many types)."""
    try:
        yield
    except Exception as exc:
        raise ListingError(f"listing {name}: the Avro block at byte {offset} is damaged ({storage.problem(exc)}); "
                           "the records from it on cannot be read") from None


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
