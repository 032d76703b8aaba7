"""What the listing step finds in a chunk of walked files, without Beam: media, rejects and skips."""
from __future__ import annotations

from dataclasses import dataclass

from shard_utils import inputs, storage
from shard_utils.inputs import listings
from shard_utils.inputs import MediaItem
from shard_utils.inputs.listings import ListingOptions



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
            found.skipped.append((entry.rel_path, out.reason, out.extension))
        else:
            found.media.append(out)
    return found


