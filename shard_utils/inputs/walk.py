"""What the listing step finds in a chunk of walked files, without Beam: media, rejects and skips."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shard_utils import inputs, storage
from shard_utils.format import names
from shard_utils.inputs import MediaItem, listings
from shard_utils.inputs.items import Entries, MediaItems, row_of
from shard_utils.inputs.listings import ListingOptions

__all__ = ["SortedChunk", "sort_chunk", "name_taken"]


@dataclass
class SortedChunk:
    """One chunk of walked files: the media, the rejects (rejected.jsonl lines), the skipped files as
    (path, reason, extension), and how many files it held."""

    media: MediaItems
    rejected: list[dict]
    skipped: list[tuple[str, str, str]]
    seen: int


def sort_chunk(entries: Sequence[storage.Entry], split_dirs: bool, root: str, options: ListingOptions,
               video: bool = False) -> SortedChunk:
    """Each walked entry classified as a media item, a reject or a skipped file. The entries' paths, sizes and
    reasons are read as columns (`items.Entries`); an entry is made only to be classified in full."""
    listed = Entries.of(entries)
    media: list[tuple] = []  # each item's fields (`items.row_of`): the chunk's items are made only where read
    found = SortedChunk(MediaItems(), [], [], len(listed))
    folders: dict[str, _Folder] = {}
    extensions = inputs.VIDEO_EXTENSIONS if video else inputs.MEDIA_EXTENSIONS
    plain_only = options.label_from_name is None  # a label from the name is found in full, name by name
    for i, (rel, size, reason) in enumerate(zip(listed.paths, listed.sizes, listed.reasons, strict=True)):
        plain = _plain_name(rel, split_dirs, extensions) if plain_only and reason is None else None
        if plain is not None and plain[0] in folders:
            media.append(folders[plain[0]].row(rel, size, plain[1]))
            continue
        entry = listed[i]
        out = listings.classify_entry(entry, split_dirs, root, options, video)
        if plain and isinstance(out, MediaItem) and _Folder.fits(out, entry, plain[1]):
            folders[plain[0]] = _Folder.of(out, plain[1])
        if isinstance(out, listings.Rejection):
            found.rejected.append(out.as_dict())
        elif isinstance(out, inputs.Skip):
            found.skipped.append((names.escaped_name(rel), out.reason, out.extension))
        elif out.source_id != rel and storage.exists(storage.join(root, out.source_id)):
            found.rejected.append(name_taken(out).as_dict())
        else:
            media.append(row_of(out))
    found.media = MediaItems.from_rows(media)
    return found


def _plain_name(rel: str, split_dirs: bool, extensions: frozenset[str]) -> tuple[str, str] | None:
    """(folder, name) of a readable entry's path whose name alone makes it media, whatever its folder (ASCII, not
    hidden, not a system file, a media extension; no split from it: not at the top of split folders; not under a
    leading "/", which an object's name may have: "/a.jpg" is no file of folder "" as "b.jpg" is); None for any
    other, classified in full. (Asked only where no label comes from the name.)"""
    if not rel.isascii() or rel[:1] == "/":
        return None
    folder, _, name = rel.rpartition("/")
    lower = name.lower()
    dot = lower.rfind(".")  # where inputs.extension_of finds the extension, on the name lowered once
    if (split_dirs and not folder) or name[:1] == "." or dot <= 0 or lower[dot:] not in extensions \
            or lower in inputs.SYSTEM_NAMES:
        return None
    return folder, name


@dataclass(frozen=True)
class _Folder:
    """What every media file with a plain name (`_plain_name`) in one folder shares as an item: all but its name,
    size and place, taken from the first one classified in full."""

    uri_prefix: str
    labels: tuple[str, ...]
    split: str | None
    no_label: tuple[str, str]

    @staticmethod
    def fits(item: MediaItem, entry: storage.Entry, name: str) -> bool:
        """Whether `_Folder.row` would make the same item of the entry (its id its path, read where it lies)."""
        return (item.source_id == entry.rel_path and item.uri.endswith(name) and item.size == entry.size
                and not item.extras and not item.origin)

    @staticmethod
    def of(item: MediaItem, name: str) -> _Folder:
        return _Folder(item.uri[:len(item.uri) - len(name)], item.labels, item.split, item.no_label)

    def row(self, rel: str, size: int, name: str) -> tuple:
        """The fields (`items.row_of`) of the item of the entry at `rel` (its name `name`)."""
        return rel, self.uri_prefix + name, size, self.labels, self.split, (), "", self.no_label


def name_taken(item: MediaItem) -> listings.Rejection:
    """The rejection of a file whose name is not UTF-8 and whose escaped name (its source id) is another file's:
    two records would share one id."""
    return listings.Rejection(item.source_id, listings.NAME_TAKEN,
                              f"the file name is not UTF-8 and its escaped form {item.source_id} names another "
                              "file; rename one of them")


