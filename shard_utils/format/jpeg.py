"""The marker structure of a JPEG file: where its primary image ends, and how many scans it has, without
decoding it. What the build checks before storing a JPEG as it is, and what `verify --deep` checks again."""
from __future__ import annotations

import re
import struct
from dataclasses import dataclass

from shard_utils.errors import TpuShardsError

__all__ = ["MAX_SCANS", "TooManyScans", "ScanEnds", "jpeg_primary_end", "PlainHeader", "PlainJpeg", "plain_header",
           "plain_jpeg"]

MAX_SCANS = 100  # progressive JPEGs have about 10; each scan is another pass over the whole picture when decoding

# Inside entropy-coded data 0xFF is followed by 0x00 (stuffing) or a restart marker (0xD0-0xD7); any other
# pair starts the next marker, possibly with fill bytes (0xFF 0xFF ...). A marker is 0xFF then neither 0x00
# nor 0xFF. (`re` looks for the leading byte first, one byte at a time; see ScanEnds for long scan data.)
_SCAN_END = re.compile(rb"\xff[^\x00\xd0-\xd7]")
VECTOR_FROM = 16 * 1024  # scan data at least this long is searched with numpy's vector compare (re below)
VECTOR_BLOCK = 2**20  # ... a block of it at a time
RESTARTS_SKIPPED = 32  # restart markers skipped in a vector search before re searches the rest
_NEXT_MARKER = re.compile(rb"\xff[^\x00\xff]")
_SOI, _EOI, _SOS, _TEM = 0xD8, 0xD9, 0xDA, 0x01
_APP0, _APP2, _APP14, _DQT, _DRI = 0xE0, 0xE2, 0xEE, 0xDB, 0xDD
_SOF = (0xC0, 0xC1, 0xC2)  # SOF0-2: baseline, extended, progressive (Huffman)
_PLAIN = {_APP0, _APP2, _APP14, _DQT, 0xC4, _DRI, 0xFE, *_SOF}  # and DHT, DRI, COM
_SEGMENT = struct.Struct(">BBH")  # a marker segment's start: 0xFF, its marker, its length


class TooManyScans(ValueError, TpuShardsError):
    """A JPEG has more scans than MAX_SCANS: decoding it would cost a pass over the picture per scan."""


def jpeg_primary_end(data: bytes, max_scans: int = MAX_SCANS) -> int:
    """The length of the primary JPEG image in `data`: the offset just past its end-of-image marker.

    Walks the marker segments (length-delimited, so an EXIF thumbnail's own markers are skipped) and
    the entropy-coded data after each start-of-scan, like a decoder does; whatever follows is a trailer.
    Raises ValueError, with a message that completes "JPEG ...", when there is no complete image, and its
    subclass TooManyScans as soon as the image has more than `max_scans` scans.
    """
    if data[:2] != b"\xff\xd8":
        raise ValueError("does not start with a start-of-image marker")
    return _end_from(data, 2, max_scans)


def _end_from(data: bytes, pos: int, max_scans: int) -> int:
    """jpeg_primary_end's walk from `pos`, a place before the first scan."""
    scans, size, ends = 0, len(data), ScanEnds(data)
    while True:
        if pos + 1 < size and data[pos] == 0xFF and data[pos + 1] not in (0x00, 0xFF):
            marker, pos = data[pos + 1], pos + 2  # where a well-formed file has its next marker
        else:
            found = _NEXT_MARKER.search(data, pos)  # skips fill bytes, and stray bytes as libjpeg does
            if found is None:
                raise ValueError("is truncated: no end-of-image marker" + (" after the scan data" if scans else
                                                                             " and no scan data"))
            marker, pos = data[found.end() - 1], found.end()
        if marker == _EOI:
            if not scans:
                raise ValueError(f"has no scan data before its end-of-image marker at offset {pos - 2}")
            return pos
        if marker == _SOI:
            raise ValueError(f"has a second start-of-image marker at offset {pos - 2} inside the image")
        if 0xD0 <= marker <= 0xD7 or marker == _TEM:  # standalone markers, no length
            continue
        start, pos = pos, _segment_end(data, pos, marker)
        if marker == _DRI and data[start + 2:pos].strip(b"\x00"):  # a restart interval: restart markers ahead
            ends.expect_restarts()
        if marker == _SOS:
            scans += 1
            if scans > max_scans:
                raise TooManyScans(f"has more than {max_scans} scans (progressive images have about 10)")
            pos = ends.first(pos)
            if pos < 0:
                raise ValueError("is truncated: no end-of-image marker after the scan data")


class ScanEnds:
    """Where entropy-coded data ends, from a place on: the first 0xFF followed by neither 0x00 nor a restart marker
    (what _SCAN_END finds). Long data is searched with numpy's vector compare, a block at a time: a vector of the
    places where 0xFF is followed by a byte other than 0x00, kept for the next scan's search, and searched at
    memchr's speed; re's search goes byte by byte and stops at each of the many stuffed 0xFF 0x00. Data with restart
    markers (many: one per restart interval) is re's to search, at no cost per marker."""

    def __init__(self, data: bytes, vector_from: int = VECTOR_FROM, block: int = VECTOR_BLOCK):
        self._data, self._vector_from, self._block = data, vector_from, block
        self._marks, self._start, self._stop = bytearray(), 0, 0  # the vector of data[start:stop]

    def first(self, pos: int) -> int:
        """The first place at or after `pos` where the scan data ends; -1 when there is none."""
        data = self._data
        last = len(data) - 1  # the last place a marker can start
        if last - pos < self._vector_from and not self._start <= pos < self._stop:
            found = _SCAN_END.search(data, pos)
            return -1 if found is None else found.start()
        restarts = 0
        while pos < last:
            if not self._start <= pos < self._stop:
                self._mark(pos, min(pos + self._block, last))
            start = self._start
            at = self._marks.find(1, pos - start)
            while at >= 0:
                if not 0xD0 <= data[start + at + 1] <= 0xD7:
                    return start + at
                restarts += 1
                if restarts > RESTARTS_SKIPPED:  # restart markers with no interval said: re's from here on
                    self.expect_restarts()
                    found = _SCAN_END.search(data, start + at + 2)
                    return -1 if found is None else found.start()
                at = self._marks.find(1, at + 2)
            pos = self._stop
        return -1

    def expect_restarts(self) -> None:
        """Search the rest with re: restart markers are ahead."""
        self._vector_from = len(self._data)
        self._marks, self._start, self._stop = bytearray(), 0, 0

    def _mark(self, start: int, stop: int) -> None:
        """The vector of data[start:stop]: 1 where 0xFF is followed by a byte other than 0x00, else 0."""
        import numpy as np

        array = np.frombuffer(self._data, np.uint8)
        marks = bytearray(stop - start)
        vector = np.frombuffer(marks, np.bool_)
        np.equal(array[start:stop], 0xFF, out=vector)
        np.logical_and(vector, array[start + 1:stop + 1], out=vector)
        self._marks, self._start, self._stop = marks, start, stop


def _segment_end(data: bytes, pos: int, marker: int) -> int:
    """Where the segment whose 2-byte length starts at `pos` ends; ValueError when it cannot be in `data`."""
    length = int.from_bytes(data[pos:pos + 2], "big")
    if pos + 2 > len(data) or pos + length > len(data):
        raise ValueError(f"is truncated in the header (segment 0xFF{marker:02X} at offset {pos - 2})")
    if length < 2:
        raise ValueError(f"has a bad segment length ({length}) at offset {pos}")
    return pos + length


@dataclass(frozen=True)
class PlainHeader:
    """A JPEG whose header is plain (see plain_header): its size and its colour components (1 grey, 3 colour)."""

    width: int
    height: int
    components: int


@dataclass(frozen=True)
class PlainJpeg(PlainHeader):
    """A plain JPEG (see plain_jpeg): its header's facts and the length of its primary image (what
    jpeg_primary_end gives)."""

    end: int


def plain_header(data: bytes) -> PlainHeader | None:
    """What a JPEG header holding nothing but JFIF, an ICC profile, Adobe's segment, tables, a comment and one 8-bit
    baseline, extended or progressive frame of 1 or 3 components says of itself, each segment where the one before
    it ends and as Pillow's Image.open reads it without an error; None for any other header. The scan data is not
    looked at (a reader's decoder judges it): one walk of the header's few segments."""
    found = _header(data)
    return None if found is None else found[0]


def plain_jpeg(data: bytes, max_scans: int = MAX_SCANS) -> PlainJpeg | None:
    """plain_header's facts and the primary image's end, for bytes whose header is plain and whose scans end in an
    end-of-image marker; None for any other bytes, whole or not (for Pillow and jpeg_primary_end to judge).

    Such a header is all a structural check needs to know, without Pillow's own parse of it: no EXIF or XMP (no
    orientation), no MPF (not an MPO), and the size and mode (1 component L, 3 RGB) Pillow gives it."""
    found = _header(data)
    if found is None:
        return None
    header, scan = found
    try:
        end = _end_from(data, scan, max_scans)
    except ValueError:
        return None
    return PlainJpeg(header.width, header.height, header.components, end)


def _header(data: bytes) -> tuple[PlainHeader, int] | None:
    """A plain header's facts and where its first start-of-scan marker is; None for any other header."""
    if data[:3] != b"\xff\xd8\xff":
        return None
    pos, size, frame = 2, len(data), None
    while pos + 4 <= size:
        tag, marker, length = _SEGMENT.unpack_from(data, pos)
        if tag != 0xFF:
            return None
        if marker == _SOS:
            break
        end = pos + 2 + length
        if marker not in _PLAIN or length < 2 or end > size or not _readable(marker, data, pos + 4, end):
            return None
        if marker in _SOF:
            if frame is not None:
                return None
            frame = data[pos + 4:end]
        pos = end
    else:
        return None
    if frame is None:
        return None
    height, width = int.from_bytes(frame[1:3], "big"), int.from_bytes(frame[3:5], "big")
    return (PlainHeader(width, height, frame[5]), pos) if width and height else None


def _readable(marker: int, data: bytes, start: int, end: int) -> bool:
    """Whether a segment of a plain header (its body data[start:end]) is one Pillow reads without an error (its JFIF
    version, an ICC profile piece's sequence numbers, Adobe's version, every quantisation table whole, a frame of
    whole component entries) and keeps the header plain (an APP2 segment is an ICC profile's piece, never MPF or
    FlashPix)."""
    length = end - start
    if marker == _APP0:
        return not data.startswith(b"JFIF", start, end) or length >= 7
    if marker == _APP2:
        return data.startswith(b"ICC_PROFILE\x00", start, end) and length >= 14
    if marker == _APP14:
        return not data.startswith(b"Adobe", start, end) or length >= 7
    if marker == _DQT:
        while start < end:
            start += 1 + (64 if data[start] < 16 else 128)  # Pillow: 8-bit values when the precision nibble is 0
        return start == end
    if marker in _SOF:
        return length >= 6 and (length - 6) % 3 == 0 and data[start] == 8 and data[start + 5] in (1, 3)
    return True
