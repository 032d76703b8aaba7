"""The shard formats, one object each, and their registry: every choice that depends on a format asks these.

A format says how its shards are named (its extensions, `filenames` makes the rest of the name), written, read
and checked, how the manifest and TFDS, Grain and Croissant name it, and whether its splits need an index for
random access. Builds write TFRecord shards first (streamed, with their index); every other format is written
from a finished TFRecord shard as its twin: the same records, in the same order, named after it.

Adding a format: a subclass here and one line in `FORMATS`.
"""
from __future__ import annotations

import abc
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import BinaryIO, ClassVar, cast

from shard_utils import storage
from shard_utils.format import array_record, filenames, tfrecord
from shard_utils.format.array_record import Written

__all__ = ["ShardFormat", "TFRecordFormat", "ArrayRecordFormat", "TFRECORD", "ARRAY_RECORD", "FORMATS", "FIRST",
           "BOTH", "OPTIONS", "READ_ERRORS", "get", "formats_of", "option_of", "of_shard", "Written"]


@dataclass(frozen=True)
class ShardFormat(abc.ABC):
    """What one shard format is to the rest of the package. The methods touch files; the fields only describe."""

    name: str  # the manifest's `shard_format`, a --format value, TFDS's FileFormat value, the default extension
    title: str  # as people read it (summaries, messages, the dataset card)
    extensions: tuple[str, ...]  # the shard file endings it accepts; the first is the one builds give
    mime_type: str  # Croissant's encodingFormat
    manifest_version: int  # the format_version of a manifest whose `shards` are this format
    indexed: bool  # random access goes through the split's index; False: the shards give it themselves
    min_record_bytes: int  # the least bytes a record takes on disk (its framing), for the manifest's size check
    error: ClassVar[type[ValueError]] = ValueError  # what `read` and `count` raise for a broken shard

    @cached_property
    def pattern(self) -> re.Pattern[str]:
        """What this format's shard names match (groups split, index, count, extension)."""
        return re.compile(filenames.shard_pattern(self.extensions))

    @property
    def name_rule(self) -> str:
        """The shard name's form, as a message gives it: `<split>-NNNNN-of-NNNNN.tfrecord (or .tfrec)`."""
        rest = "".join(f" (or .{e})" for e in self.extensions[1:])
        return f"<split>-NNNNN-of-NNNNN.{self.extensions[0]}{rest}"

    def shard_name(self, split: str, index: int, count: int, extension: str | None = None, generation: int = 0) -> str:
        """The file name of shard `index` of `count` of a split (of one generation of it)."""
        extension = extension or self.extensions[0]
        if extension not in self.extensions:
            raise ValueError(f"{self.title} shards end in {' or '.join(self.extensions)}, not {extension!r}")
        return filenames.shard_name(split, index, count, extension, generation)

    def matches(self, file_name: str) -> re.Match[str] | None:
        """The parts of a file name of this format's shards, or None."""
        return self.pattern.match(file_name)

    def extension_of(self, file_name: str) -> str | None:
        """The extension a shard name of this format ends in, or None when it names no shard of it."""
        found = self.matches(file_name)
        return found["extension"] if found else None

    def twin_name(self, shard: str) -> str:
        """The name of this format's twin of a TFRecord shard: `train-00000-of-00008.tfrecord` -> `...array_record`."""
        found = FIRST.matches(shard)
        if not found:
            raise ValueError(f"{shard!r} is not a {FIRST.title} shard name")
        return shard[:found.start("extension")] + self.extensions[0]

    def check_installed(self, needed_for: str) -> None:
        """MissingExtra now, before any work, when the package this format needs is missing (`needed_for`: what the
        user asked for that needs it). A format that needs none has nothing to check."""
        return None

    @abc.abstractmethod
    def write(self, records: Iterable[bytes], dst: str) -> Written:
        """Write the records, in order, as the shard `dst` (local or gs://), which appears whole or not at all."""

    @abc.abstractmethod
    def read(self, uri: str, where: str | None = None) -> Iterator[bytes]:
        """Every record of a shard in order, checked as the format allows; `error` naming `where` (the shard) when
        it cannot be read."""

    @abc.abstractmethod
    def count(self, uri: str, where: str | None = None) -> int:
        """The records a shard holds, checking its structure on the way; `error` naming `where` when broken."""


class TFRecordFormat(ShardFormat):
    """TFRecord: length-framed records with CRC32C checksums (`tfrecord`), random access through the index."""

    error = tfrecord.FramingError

    def write(self, records: Iterable[bytes], dst: str) -> Written:
        digest, count = storage.Digest(), 0
        with storage.open_write(dst) as out:
            for record in records:
                framed = tfrecord.frame(record)
                digest.update(framed)
                out.write(framed)
                count += 1
        return Written(count, digest.size, digest.crc32c, digest.sha256)

    def read(self, uri: str, where: str | None = None) -> Iterator[bytes]:
        with storage.open_read(uri) as f:
            try:
                yield from tfrecord.iter_records(cast(BinaryIO, f))
            except tfrecord.FramingError as exc:
                raise tfrecord.FramingError(f"{where or uri}: {exc}") from None

    def count(self, uri: str, where: str | None = None) -> int:
        with storage.open_read(uri) as f:
            try:
                return tfrecord.count_from_headers(f, storage.size(uri))
            except tfrecord.FramingError as exc:
                raise tfrecord.FramingError(f"{where or uri}: {exc}") from None


class ArrayRecordFormat(ShardFormat):
    """ArrayRecord (`array_record`, an extra): records in chunks with a footer, random access by record number
    (Grain's ArrayRecordDataSource), so its splits need no index."""

    error = array_record.ArrayRecordError

    def check_installed(self, needed_for: str) -> None:
        array_record.check_installed(needed_for)

    def write(self, records: Iterable[bytes], dst: str) -> Written:
        return array_record.write_shard(records, dst)

    def read(self, uri: str, where: str | None = None) -> Iterator[bytes]:
        return array_record.read_records(uri, where)

    def count(self, uri: str, where: str | None = None) -> int:
        return array_record.count_records(uri, where)


TFRECORD = TFRecordFormat("tfrecord", "TFRecord", ("tfrecord", "tfrec"),  # tfrec: what Kaggle's TPU notebooks glob
                          "application/x-tfrecord", manifest_version=2, indexed=True,
                          min_record_bytes=tfrecord.HEADER + tfrecord.FOOTER)
ARRAY_RECORD = ArrayRecordFormat("array_record", "ArrayRecord", ("array_record",), "application/x-array-record",
                                 manifest_version=3, indexed=False, min_record_bytes=0)

# The registry, in the order a dataset lists its formats (the first one's shards are a manifest's `shards`).
FORMATS: dict[str, ShardFormat] = {f.name: f for f in (TFRECORD, ARRAY_RECORD)}
FIRST = TFRECORD  # what builds write first, and what a manifest without `shard_format` holds
READ_ERRORS: tuple[type[ValueError], ...] = tuple(f.error for f in FORMATS.values())  # any broken shard's error
BOTH = "both"  # --format both: TFRecord shards and their ArrayRecord twins
OPTIONS = (*FORMATS, BOTH)  # the --format values


def get(name: str) -> ShardFormat:
    """The format called `name`; ValueError listing the formats there are."""
    if name not in FORMATS:
        raise ValueError(f"shard format {name!r} is not one of {', '.join(FORMATS)}")
    return FORMATS[name]


def formats_of(option: str) -> tuple[str, ...]:
    """The shard formats a --format value publishes: ("tfrecord",), ("array_record",) or both."""
    if option not in OPTIONS:
        raise ValueError(f"--format {option!r} is not one of {', '.join(OPTIONS)}")
    return (TFRECORD.name, ARRAY_RECORD.name) if option == BOTH else (option,)


def option_of(formats: tuple[str, ...]) -> str:
    """The --format value that publishes `formats` (a dataset's `Manifest.formats`): the inverse of formats_of."""
    return next(option for option in OPTIONS if formats_of(option) == tuple(formats))


def of_shard(file_name: str) -> ShardFormat | None:
    """The format whose shard names `file_name` matches, or None."""
    return next((f for f in FORMATS.values() if f.matches(file_name)), None)
