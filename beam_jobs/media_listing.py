"""What the listing step finds, without Beam: a walked input's files sorted into media, rejects and skips,
and its label names; or a --listing's rows turned into unique media and rejects.

ListMedia and ListListedMedia do this work in the build, or (a local build with worker processes) take
what a worker found while Beam was still building and starting the graph (`start_early`, `take_early`):
the listing is then off the path every worker waits on. Workers import this module without Beam.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence

from shard_utils import inputs, listing_files, listings, storage
from shard_utils.inputs import MediaItem
from shard_utils.listings import ListingOptions, ListingRow

from .config import BuildConfig
from .local_pool import LocalPool

LIST_CHUNK = 256  # listed files per element: the unit of parallelism of the encode step


@dataclass
class SortedChunk:
    """One chunk of walked files: the media, the rejects (rejected.jsonl lines), the skipped files as
    (path, reason, extension), and how many files it held."""

    media: list[MediaItem]
    rejected: list[dict]
    skipped: list[tuple[str, str, str]]
    seen: int


def walk_chunks(root: str, follow_symlinks: bool = False, size: int = LIST_CHUNK) -> Iterator[list[storage.Entry]]:
    """The files under root, `size` at a time."""
    walked = storage.walk(root, follow_symlinks=follow_symlinks)
    while chunk := list(itertools.islice(walked, size)):
        yield chunk


def sort_chunk(entries: list[storage.Entry], split_dirs: bool, root: str, options: ListingOptions,
               video: bool = False) -> SortedChunk:
    """Each walked entry classified as a media item, a reject or a skipped file."""
    found = SortedChunk([], [], [], len(entries))
    for entry in entries:
        out = listings.classify_entry(entry, split_dirs, root, options, video)
        if isinstance(out, listings.Rejection):
            found.rejected.append(out.as_dict())
        elif isinstance(out, inputs.Skip):
            found.skipped.append((entry.rel_path, out.reason, out.extension))
        else:
            found.media.append(out)
    return found


@dataclass
class ListedRows:
    """A listing's rows as media: the unique items in chunks, the rejects (bad rows, rows naming a file
    again) and how many rows there were."""

    chunks: list[list[MediaItem]]
    rejected: list[dict]
    seen: int


def items_of_rows(rows: Iterable[ListingRow], options: ListingOptions, root: str | None) -> ListedRows:
    """Every row as an item or a reject; of rows naming one file, the first (by listing, position) is kept."""
    found = ListedRows([], [], 0)
    by_file: dict[str, list] = {}
    for row in rows:
        found.seen += 1
        out = listings.item_from_row(row, options, root)
        if isinstance(out, listings.Rejection):
            found.rejected.append(out.as_dict())
        else:
            by_file.setdefault(listings.duplicate_key(out), []).append((row.order, out))
    unique = []
    for same_file in by_file.values():
        kept, duplicates = listings.pick_first(same_file) if len(same_file) > 1 else (same_file[0][1], [])
        unique.append(kept)
        found.rejected.extend(rejection.as_dict() for rejection in duplicates)
    found.chunks = [unique[start:start + LIST_CHUNK] for start in range(0, len(unique), LIST_CHUNK)]
    return found


def walked_labels(root: str, follow_symlinks: bool, split_dirs: bool, options: ListingOptions,
                  video: bool = False) -> list[str]:
    """The label names of the media under root, each once, in sorted order (what DistinctLabels gives)."""
    found: set[str] = set()
    by_folder = options.label_from_name is None  # a walked item's one label is then its label folder's name

    def known(folder: str) -> bool:  # a folder of a found label: the rest of it is not listed (locally)
        return inputs.split_and_label(folder + "/_", split_dirs)[1] in found

    for entry in storage.walk(root, follow_symlinks=follow_symlinks, prune=known if by_folder else None):
        if by_folder and inputs.split_and_label(entry.rel_path, split_dirs)[1] in found:
            continue  # this folder's label is known: classifying its other files cannot add one
        item = listings.classify_entry(entry, split_dirs, root, options, video)
        if isinstance(item, MediaItem):
            found.update(item.labels)
    return sorted(found)


# ----------------------------------------------------------------------- the same work, started early


def walk_and_sort(_: list, config: BuildConfig) -> list[SortedChunk]:
    """Every chunk of the input, sorted (a pool task)."""
    return [sort_chunk(chunk, config.split_dirs, config.input, config.listing, config.video is not None)
            for chunk in walk_chunks(config.input, config.follow_symlinks)]


def labels_of(_: list, config: BuildConfig) -> list[str]:
    """The input's label names (a pool task)."""
    return walked_labels(config.input, config.follow_symlinks, config.split_dirs, config.listing,
                         config.video is not None)


def read_listings(_: list, config: BuildConfig, files: Sequence[tuple[str, str]]) -> ListedRows:
    """The rows of local, uncompressed listing files given as (path, format), as media (a pool task)."""
    def rows() -> Iterator[ListingRow]:
        for path, fmt in files:
            with open(path, "rb") as f:
                yield from listing_files.read_rows(f, path, fmt)

    return items_of_rows(rows(), config.listing, config.input)


def start_early(config: BuildConfig, listing_files: Sequence[tuple[str, str]] | None = None) -> bool:
    """Start the listing step's work in this thread's worker processes, if it has some; True when started.
    A --listing is read early only when `listing_files` names its files (local, uncompressed: see
    listing_io.plain_local_files), each with its format.

    Only where the listing step will run in this thread (where the pool was started before the graph)."""
    pool = LocalPool.current()
    if not config.local or pool is None or pool.size != config.workers:
        return False
    if config.uses_listing:
        if listing_files is None:
            return False
        pool.start(_key(config, "media"), f"{__name__}.read_listings", config, list(listing_files))
        return True
    pool.start(_key(config, "media"), f"{__name__}.walk_and_sort", config)
    pool.start(_key(config, "labels"), f"{__name__}.labels_of", config)
    return True


def take_early(config: BuildConfig, what: str) -> Any | None:
    """What the listing work begun early found (`what`: "media", or "labels" of a walk), waiting for it;
    None when it was not begun or did not finish (its worker died, or it failed: the step then does the
    work itself, and meets the same error where it would have anyway)."""
    pool = LocalPool.current()
    return pool.take(_key(config, what)) if pool is not None else None


def _key(config: BuildConfig, what: str) -> str:
    return f"{config.run_id}:{config.input}:{what}"
