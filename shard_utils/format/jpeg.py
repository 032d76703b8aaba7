"""The marker structure of a JPEG file: where its primary image ends, and how many scans it has, without
decoding it. What the build checks before storing a JPEG as it is, and what `verify --deep` checks again."""
from __future__ import annotations

import re

from shard_utils.errors import TpuShardsError

__all__ = ["MAX_SCANS", "TooManyScans", "jpeg_primary_end"]

MAX_SCANS = 100  # progressive JPEGs have about 10; each scan is another pass over the whole picture when decoding

# Inside entropy-coded data 0xFF is followed by 0x00 (stuffing) or a restart marker (0xD0-0xD7); any other
# pair starts the next marker, possibly with fill bytes (0xFF 0xFF ...). A marker is 0xFF then neither 0x00
# nor 0xFF. (A single leading byte lets `re` find candidates at memchr speed.)
_SCAN_END = re.compile(rb"\xff[^\x00\xd0-\xd7]")
_NEXT_MARKER = re.compile(rb"\xff[^\x00\xff]")
_SOI, _EOI, _SOS, _TEM = 0xD8, 0xD9, 0xDA, 0x01


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
    pos, scans, size = 2, 0, len(data)
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
        pos = _segment_end(data, pos, marker)
        if marker == _SOS:
            scans += 1
            if scans > max_scans:
                raise TooManyScans(f"has more than {max_scans} scans (progressive images have about 10)")
            found = _SCAN_END.search(data, pos)
            if found is None:
                raise ValueError("is truncated: no end-of-image marker after the scan data")
            pos = found.start()


def _segment_end(data: bytes, pos: int, marker: int) -> int:
    """Where the segment whose 2-byte length starts at `pos` ends; ValueError when it cannot be in `data`."""
    length = int.from_bytes(data[pos:pos + 2], "big")
    if pos + 2 > len(data) or pos + length > len(data):
        raise ValueError(f"is truncated in the header (segment 0xFF{marker:02X} at offset {pos - 2})")
    if length < 2:
        raise ValueError(f"has a bad segment length ({length}) at offset {pos}")
    return pos + length
