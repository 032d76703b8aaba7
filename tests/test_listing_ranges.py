"""Listing at scale, without a server: the Cloud Storage stand-in's paging, where ranges are cut, and ListMedia's
own tasks run stage by stage over tens of thousands of names (benchmarks/scale_sim)."""
from __future__ import annotations

import bisect
import itertools
import random

import pytest

from benchmarks.scale_sim import listing as sim
from benchmarks.scale_sim.stand_in import page
from shard_utils.storage import base as storage_base
from shard_utils.storage import ranges

NAMES = sorted(["a.jpg", "b/1.jpg", "b/2.jpg", "b/c/3.jpg", "b0.jpg", "c.jpg", "d/4.jpg", "e.jpg"])


def pages(names, **kwargs):
    """Every page of a listing, following its tokens."""
    out, token = [], None
    while True:
        found = page(names, token=token, **kwargs)
        out.append((found.items, found.prefixes))
        if found.token is None:
            return out
        token = found.token


def test_the_stand_in_counts_a_prefix_once_where_its_first_object_would_be():
    assert pages(NAMES, delimiter="/", max_results=2) == [
        (["a.jpg"], ["b/"]), (["b0.jpg", "c.jpg"], []), (["e.jpg"], ["d/"])]
    assert pages(NAMES, prefix="b/", delimiter="/", max_results=1) == [(["b/1.jpg"], []), (["b/2.jpg"], []),
                                                                         ([], ["b/c/"])]
    assert [n for items, _ in pages(NAMES, max_results=3) for n in items] == NAMES  # no delimiter: every object


def test_the_stand_in_applies_offsets_to_object_names_and_derives_prefixes_from_them():
    # b/2.jpg is in [b/2, d): its prefix b/ is returned though 'b/' itself is before the start.
    assert pages(NAMES, delimiter="/", start_offset="b/2", end_offset="d") == [(["b0.jpg", "c.jpg"], ["b/"])]
    assert pages(NAMES, delimiter="/", start_offset="b0", end_offset="d/4.jpg") == [(["b0.jpg", "c.jpg"], [])]
    assert pages(NAMES, start_offset="b/c", end_offset="c.jpg") == [(["b/c/3.jpg", "b0.jpg"], [])]


def hexes(n: int) -> list[str]:
    rng = random.Random(5)
    return [f"{x:032x}" for x in sorted(rng.getrandbits(128) for _ in range(n))]


# The widest level of each layout of the simulator, 60,000 names: (level, names under it).
WIDEST = {
    "flat_numbered": lambda n: ("", [f"IMG_{i:08d}.jpg" for i in range(n)]),
    "flat_hex": lambda n: ("", [f"{h}.jpg" for h in hexes(n)]),
    "folder_per_sample": lambda n: ("", [f"{h}/img.jpg" for h in hexes(n)]),
    "label_folders": lambda n: ("n01440764/", [f"n01440764/{i:07d}.jpg" for i in range(n)]),
    "date_folders": lambda n: ("2020/02/29/23/", [f"2020/02/29/23/{i:06d}.jpg" for i in range(n)]),
    "two_level_hex": lambda n: ("3f/a0/", [f"3f/a0/{h}.jpg" for h in hexes(n)]),
}


@pytest.mark.parametrize("layout", list(WIDEST))
def test_cuts_from_the_first_names_split_the_rest_of_each_layout_exactly_once_and_evenly(layout):
    level, names = WIDEST[layout](60_000)
    seen = 1000
    keys = sorted({ranges.level_key(x, level) for x in names[:seen]})
    last = names[seen - 1]
    more = level + ranges.level_key(last, level) + ("/" if "/" in last[len(level):] else "")
    parts = ranges.ranges_between((more, False), ranges.cut_points(level, keys, 64), None)
    assert 2 <= len(parts) <= 65
    rest = names[seen:]
    sizes = []
    for start, end in parts:
        name, inclusive = ranges.start_of(start)
        lo = (bisect.bisect_left if inclusive else bisect.bisect_right)(rest, name)
        hi = bisect.bisect_left(rest, end) if end else len(rest)
        sizes.append(hi - lo)
    assert min(sizes) >= 0 and sum(sizes) == len(rest)  # contiguous and disjoint: each name in exactly one range
    assert max(sizes) <= len(rest) / 5, sizes  # no range holds most of the rest


def test_cut_points_never_fall_inside_a_sub_folder():
    keys = ["a", "a-b", "a.b", "ab"]
    for cut in ranges.cut_points("x/", keys, 64, seen_too=True):
        assert "/" not in cut[len("x/"):]
    assert ranges.start_of(("x/ab/", False)) == ("x/ab0", True)
    assert ranges.ranges_between(("x/ab/", False), ["x/ab0", "x/ab1", "x/b"], "x/c") == [
        (("x/ab/", False), "x/ab1"), (("x/ab1", True), "x/b"), (("x/b", True), "x/c")]


@pytest.mark.parametrize("layout", list(sim.LAYOUTS))
def test_list_media_tasks_list_every_object_once_with_a_short_critical_path(layout, monkeypatch):
    """30,000 names in pages of 10 (3,000 pages, as 3 million objects in pages of 1,000 would be): the stages
    list each object once, and the longest chain of pages listed one after another is at most 2 % of them."""
    monkeypatch.setattr(storage_base, "LIST_PAGE_SIZE", 10)
    names = list(itertools.islice(sim.LAYOUTS[layout](30_000), 30_000))
    found = sim.simulate(names)
    assert found["once"] and found["listed"] == len(names) and found["left"] == 0
    assert found["preflight"] == 1
    assert found["critical"] <= 0.02 * found["pages"], found


def test_a_flat_range_whose_pages_lie_in_one_large_sub_folder_hands_on_its_rest_and_the_level_after(monkeypatch):
    """A level of one-file folders (listed flat, range by range) with two large folders among them, one
    holding sub-folders of its own: a range whose pages all lie in one of them goes on in that folder and,
    separately, in the level after it; every object is still listed once."""
    monkeypatch.setattr(storage_base, "LIST_PAGE_SIZE", 5)
    names = sorted([f"u{i:03d}/img.jpg" for i in range(120)] + [f"u050x/{i:04d}.jpg" for i in range(400)]
                   + [f"u090x/{d}/{i:03d}.jpg" for d in "abc" for i in range(150)])
    found = sim.simulate(names)
    assert found["once"] and found["listed"] == len(names) and found["left"] == 0
    assert found["critical"] <= found["pages"] / 2, found  # listed in turn, it would be all of them
