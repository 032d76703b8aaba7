"""A chunk of walked files is classified as each of its files alone would be: the items of plain names in a folder
already seen (shard_utils.inputs.walk) are the full classification's, field for field."""
from __future__ import annotations

import itertools
import pickle

import pytest

from shard_utils import storage
from shard_utils.inputs import walk
from shard_utils.inputs.items import Entries
from shard_utils.inputs.listings import ListingOptions

FOLDERS = ["", "cat", "dog", "train", "train/cat", "test/a b/c", ".hid", "cat/.git", "__MACOSX/cat", "d\udcff",
           "caf\u00e9", "cafe\u0301", "x/y/z", "a.b", "val/cat"]
# "/g.jpg": an object store's name may start with "/" (at the top, "/g.jpg"; in a folder, "cat//g.jpg")
NAMES = ["a.jpg", "b.JPEG", "c.png", ".h.jpg", "notes.txt", "Thumbs.db", "v.mp4", "noext", "e\udcfe.jpg",
         "\u00e9.jpg", "d.webp", "f.jpg", "/g.jpg", "H.JPG", ".DS_Store", "cat.jpg"]


def entries():
    """Every folder with every name, a few unreadable ones among them, in walk order (sorted)."""
    out = []
    for i, (folder, name) in enumerate(itertools.product(FOLDERS, NAMES)):
        rel = f"{folder}/{name}" if folder else name
        out.append(storage.Entry(rel, 100 + i, *(("unreadable", "cannot read") if i % 17 == 5 else ())))
    return sorted(out, key=lambda e: e.rel_path)


def one_by_one(chunk, *args):
    """What each entry of the chunk makes alone (a chunk of one is always classified in full), gathered."""
    alone = [walk.sort_chunk([entry], *args) for entry in chunk]
    return ([i for a in alone for i in a.media], [r for a in alone for r in a.rejected],
            [s for a in alone for s in a.skipped])


@pytest.mark.parametrize("split_dirs", [False, True])
@pytest.mark.parametrize("video", [False, True])
@pytest.mark.parametrize("options", [ListingOptions(), ListingOptions(label_separator=" "),
                                     ListingOptions(label_from_name=r"(?P<label>[a-z])\.")])
def test_a_chunk_is_classified_as_its_files_alone(tmp_path, split_dirs, video, options):
    chunk = entries()
    args = (split_dirs, str(tmp_path), options, video)
    found = walk.sort_chunk(chunk, *args)
    assert (found.media, found.rejected, found.skipped) == one_by_one(chunk, *args)
    arrived = walk.sort_chunk(pickle.loads(pickle.dumps(Entries(chunk))), *args)  # as the listing step hands it on
    assert (arrived.media, arrived.rejected, arrived.skipped) == (found.media, found.rejected, found.skipped)
    assert found.seen == len(chunk)
    assert len(found.media) + len(found.rejected) + len(found.skipped) == len(chunk)


def test_plain_names_in_a_folder_share_its_label_split_and_place(tmp_path):
    chunk = [storage.Entry(f"train/cat/{n:03d}.jpg", n) for n in range(5)]
    found = walk.sort_chunk(chunk, True, str(tmp_path), ListingOptions(), False)
    assert [(i.source_id, i.uri, i.size, i.labels, i.split) for i in found.media] == [
        (f"train/cat/{n:03d}.jpg", str(tmp_path / "train" / "cat" / f"{n:03d}.jpg"), n, ("cat",), "train")
        for n in range(5)]
