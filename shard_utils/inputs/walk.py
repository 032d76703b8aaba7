"""What the listing step finds in a chunk of walked files, without Beam: media, rejects and skips."""
from __future__ import annotations

from dataclasses import dataclass

from shard_utils import inputs, storage
from shard_utils.format import names
from shard_utils.inputs import MediaItem, listings
from shard_utils.inputs.listings import ListingOptions

__all__ = ["SortedChunk", "sort_chunk", "name_taken"]


@dataclass
class SortedChunk:
    """One chunk of walked files: the media, the rejects (rejected.jsonl lines), the skipped files as
    (path, reason, extension), and how many files it held."""

    media: list[MediaItem]
    rejected: list[dict]
    skipped: list[tuple[str, str, str]]
    seen: int


def sort_chunk(entries: list[storage.Entry], split_dirs: bool, root: str, options: ListingOptions,
               video: bool = False) -> SortedChunk:
    """Each walked entry classified as a media item, a reject or a skipped file."""
    found = SortedChunk([], [], [], len(entries))
    for entry in entries:
        out = listings.classify_entry(entry, split_dirs, root, options, video)
        if isinstance(out, listings.Rejection):
            found.rejected.append(out.as_dict())
        elif isinstance(out, inputs.Skip):
            found.skipped.append((names.escaped_name(entry.rel_path), out.reason, out.extension))
        elif out.source_id != entry.rel_path and storage.exists(storage.join(root, out.source_id)):
            found.rejected.append(name_taken(out).as_dict())
        else:
            found.media.append(out)
    return found


def name_taken(item: MediaItem) -> listings.Rejection:
    """The rejection of a file whose name is not UTF-8 and whose escaped name (its source id) is another file's:
    two records would share one id."""
    return listings.Rejection(item.source_id, listings.NAME_TAKEN,
                              f"the file name is not UTF-8 and its escaped form {item.source_id} names another "
                              "file; rename one of them")


