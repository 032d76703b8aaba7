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
    folders: dict[str, _Folder] = {}
    extensions = inputs.VIDEO_EXTENSIONS if video else inputs.MEDIA_EXTENSIONS
    for entry in entries:
        plain = _plain_name(entry, split_dirs, options, extensions)
        if plain is not None and plain[0] in folders:
            found.media.append(folders[plain[0]].item(entry, plain[1]))
            continue
        out = listings.classify_entry(entry, split_dirs, root, options, video)
        if plain and isinstance(out, MediaItem) and _Folder.fits(out, entry, plain[1]):
            folders[plain[0]] = _Folder.of(out, plain[1])
        if isinstance(out, listings.Rejection):
            found.rejected.append(out.as_dict())
        elif isinstance(out, inputs.Skip):
            found.skipped.append((names.escaped_name(entry.rel_path), out.reason, out.extension))
        elif out.source_id != entry.rel_path and storage.exists(storage.join(root, out.source_id)):
            found.rejected.append(name_taken(out).as_dict())
        else:
            found.media.append(out)
    return found


def _plain_name(entry: storage.Entry, split_dirs: bool, options: ListingOptions,
                extensions: frozenset[str]) -> tuple[str, str] | None:
    """(folder, name) of a readable entry whose name alone makes it media, whatever its folder (ASCII, not hidden,
    not a system file, a media extension; no label from the name, no split from it: not at the top of split
    folders; not under a leading "/", which an object's name may have: "/a.jpg" is no file of folder "" as "b.jpg"
    is); None for any other, classified in full."""
    rel = entry.rel_path
    if entry.reason is not None or options.label_from_name is not None or not rel.isascii() or rel[:1] == "/":
        return None
    folder, _, name = rel.rpartition("/")
    if (split_dirs and not folder) or name[:1] == "." or name.lower() in inputs.SYSTEM_NAMES \
            or inputs.extension_of(name) not in extensions:
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
        """Whether `_Folder.item` would make the same item of the entry (its id its path, read where it lies)."""
        return (item.source_id == entry.rel_path and item.uri.endswith(name) and item.size == entry.size
                and not item.extras and not item.origin)

    @staticmethod
    def of(item: MediaItem, name: str) -> _Folder:
        return _Folder(item.uri[:len(item.uri) - len(name)], item.labels, item.split, item.no_label)

    def item(self, entry: storage.Entry, name: str) -> MediaItem:
        return MediaItem(entry.rel_path, self.uri_prefix + name, entry.size, self.labels, self.split,
                         no_label=self.no_label)


def name_taken(item: MediaItem) -> listings.Rejection:
    """The rejection of a file whose name is not UTF-8 and whose escaped name (its source id) is another file's:
    two records would share one id."""
    return listings.Rejection(item.source_id, listings.NAME_TAKEN,
                              f"the file name is not UTF-8 and its escaped form {item.source_id} names another "
                              "file; rename one of them")


