"""Listed files and items held as columns (shard_utils.inputs.items: Entries, MediaItems) and keyed for their runs
(beam_jobs.pipeline.chunks.KeyedItems): they read, compare, pickle and cut as the items they were made from, and
the steps that read only their columns (key, count, sample, boundaries, assign) give what they give item by item."""
from __future__ import annotations

import dataclasses
import heapq
import pickle

import pytest

from beam_jobs.pipeline.chunks import KeyedItems
from beam_jobs.pipeline.encode import _AssignRunsFn, assign_runs
from beam_jobs.pipeline.listing import label_names
from beam_jobs.pipeline.plan_runs import SmallestFn, boundary_keys, key_chunk
from shard_utils.format.order import choose_split, sort_key, sort_keys
from shard_utils.inputs import MediaItem
from shard_utils.inputs.items import Entries, MediaItems, row_of
from shard_utils.sharding.encode_run import item_order
from shard_utils.sharding.run_plan import SplitLayout
from shard_utils.storage import Entry

SPLITS = (("train", 0.6), ("validation", 0.3), ("test", 0.1))


def walked(n: int, folder: str = "cat") -> list[MediaItem]:
    """Items as a folder walk makes them: one label tuple and no_label shared by the folder."""
    labels, no_label = (folder,), ("", "")
    return [MediaItem(f"{folder}/{i:05d}.jpg", f"/in/{folder}/{i:05d}.jpg", 1000 + i, labels, no_label=no_label)
            for i in range(n)]


def varied() -> list[MediaItem]:
    """Items of every shape a listing makes: splits, extras, origins, several labels, none."""
    return [MediaItem("a.jpg", "gs://b/a.jpg", 0, ()),
            MediaItem("b.jpg", "/in/b.jpg", 7, ("x", "y"), "validation", (("score", (1.5,)),), "l.csv row 2"),
            MediaItem("c.jpg", "/in/c.jpg", -1, (), "test", no_label=("no_label", "no label column"))]


@pytest.mark.parametrize("items", [walked(40), varied(), []], ids=["walked", "varied", "empty"])
def test_items_read_compare_and_pickle_as_the_items_they_were_made_from(items):
    made = MediaItems(items)
    assert made == items and list(made) == items and len(made) == len(items)
    for packed in (MediaItems.from_rows([row_of(i) for i in items]), pickle.loads(pickle.dumps(made))):
        assert packed == items and len(packed) == len(items)
        assert [packed[k] for k in range(len(items))] == items  # one item, made alone, before the rest
        assert [hash(i) for i in packed] == [hash(i) for i in items]
        assert [dataclasses.asdict(i) for i in packed] == [dataclasses.asdict(i) for i in items]
        assert packed.source_ids == tuple(i.source_id for i in items)
        assert packed.sizes == tuple(i.size for i in items) and packed.splits == tuple(i.split for i in items)
    assert MediaItems.of(made) is made and MediaItems.of(items) == items
    if items:
        assert made != items[:-1] and made[-1] == items[-1]
        with pytest.raises(dataclasses.FrozenInstanceError):
            pickle.loads(pickle.dumps(made))[0].size = 5  # an item made from columns is as frozen as any


def test_items_pickle_once_in_fewer_bytes_than_the_objects_and_cut_by_position():
    items = walked(256)
    made = MediaItems(items)
    packed = pickle.dumps(made)
    assert pickle.dumps(made) == packed  # the columns are pickled once; later trips reuse the bytes
    assert len(packed) < 0.8 * len(pickle.dumps(tuple(items)))  # a folder's labels are written once
    back = pickle.loads(packed)
    for positions in ([5, 0, 255, 17], [9], []):
        assert back.select(positions) == [items[k] for k in positions]
        assert pickle.loads(pickle.dumps(back.select(positions))) == [items[k] for k in positions]


def test_listed_files_read_and_pickle_as_the_entries_they_were_made_from():
    entries = [Entry(f"cat/{i}.jpg", i) for i in range(5)] + [Entry("dog/", 0, "unreadable", "cannot list")]
    back = pickle.loads(pickle.dumps(Entries(entries)))
    assert back == entries and back[5] == entries[5] and list(back.select([5, 1])) == [entries[5], entries[1]]
    assert back.paths == tuple(e.rel_path for e in entries) and back.sizes == tuple(range(5)) + (0,)
    assert back.reasons == (None,) * 5 + ("unreadable",) and Entries.of(back) is back and Entries() == []


def test_label_names_are_every_label_of_a_chunk_once():
    assert label_names(MediaItems(walked(3, "cat") + varied() + walked(2, "dog"))) == {"cat", "dog", "x", "y"}
    assert label_names(varied()) == {"x", "y"} and label_names(MediaItems()) == set()


def test_keyed_items_read_as_their_triples_and_refuse_columns_of_other_lengths():
    items = walked(10) + varied()
    keyed = key_chunk(items, SPLITS, 7)
    triples = [(item.split or choose_split(list(SPLITS), 7, item.source_id), item_order(item, 7), item)
               for item in items]
    assert keyed == triples and list(keyed) == triples and keyed[3] == triples[3]
    back = pickle.loads(pickle.dumps(keyed))
    assert back == triples and KeyedItems.of(triples) == triples and KeyedItems.of(back) is back
    assert key_chunk(MediaItems(items), [("all", 1.0)], 7).splits == tuple(i.split or "all" for i in items)
    with pytest.raises(ValueError, match="2 splits and 1 keys for 1 items"):
        KeyedItems(["a", "b"], [(1, "x")], MediaItems(items[:1]))


@pytest.mark.parametrize("seed", [0, 7, -3, 2**40])
def test_sort_keys_of_many_are_each_ones_sort_key(seed):
    keys = ["", "a.jpg", "caf\u00e9/\u00e9t\u00e9.jpg", "gs://b/x y.png", "d\\x%ff.jpg", "k" * 300, "a.jpg"]
    assert sort_keys(seed, keys) == [sort_key(seed, key) for key in keys]


def layout(orders: list[tuple[int, str]], runs: int) -> SplitLayout:
    """A split of these keys cut into `runs` runs at evenly spaced keys (every bucket a boundary bucket)."""
    ordered = sorted(orders)
    starts = tuple(ordered[len(ordered) * r // runs] for r in range(1, runs))
    return SplitLayout("train", len(orders), 0, runs, runs, bucket_bits=0, boundary_slots=((0, 0),) * (runs - 1),
                       boundaries=starts)


def test_the_column_steps_give_what_the_items_one_by_one_give():
    """Runs are assigned, boundary keys found and the sample's first items picked from the columns as from the
    (split, order, item) triples one by one, over several chunks (the sample's filter by its largest key
    included)."""
    chunks = [key_chunk(walked(60, folder), [("train", 1.0)], 3) for folder in ("a", "b", "c")]
    triples = [t for chunk in chunks for t in chunk]
    found = {"train": layout([o for _, o, _ in triples], 5)}
    for chunk in chunks:
        by_run: dict = {}
        for split, order, item in chunk:
            by_run.setdefault((split, found[split].run_of(order)), []).append(item)
        assigned = list(assign_runs(pickle.loads(pickle.dumps(chunk)), [found], workers=1))
        assert [(key[:2], list(items)) for key, items in assigned] == [(k, v) for k, v in by_run.items()]
        assert list(boundary_keys(chunk, [found])) == [(("train", 0), o) for _, o, _ in chunk]
    smallest = SmallestFn(8)
    acc = smallest.create_accumulator()
    for chunk in chunks:
        acc = smallest.add_input(acc, chunk)
    assert smallest.extract_output(acc) == [i for _, i in heapq.nsmallest(8, [(o, i) for _, o, i in triples])]


@pytest.mark.parametrize("held", [_AssignRunsFn.HELD_ITEMS, 100])
def test_a_bundles_chunks_reach_each_run_joined_into_one_element_or_a_few_past_the_held_items(held):
    chunks = [key_chunk(walked(60, folder), [("train", 1.0)], 3) for folder in ("a", "b", "c")]
    found = {"train": layout([o for chunk in chunks for _, o, _ in chunk], 4)}
    fn = _AssignRunsFn(workers=1)
    fn.HELD_ITEMS = held
    fn.start_bundle()
    out = [x for chunk in chunks for x in fn.process((chunk, found))]
    out += [w.value for w in fn.finish_bundle()]
    by_run: dict = {}
    for (split, run, _), items in out:
        by_run.setdefault((split, run), []).extend(items)
    expected: dict = {}
    for key, items in (x for chunk in chunks for x in assign_runs(chunk, [found])):
        expected.setdefault(key[:2], []).extend(items)
    assert by_run == expected and sum(map(len, by_run.values())) == 180
    assert len(out) == (4 if held > 180 else 8)  # a run an element; past 100 items held: after chunk 2, and at the end
    assert MediaItems.joined([MediaItems(walked(2)), MediaItems(), MediaItems(walked(3, "b"))]) == \
        walked(2) + walked(3, "b")
