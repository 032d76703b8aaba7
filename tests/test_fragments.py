"""Fragments: records and their metadata files written, cut into slices and read back in windows, in key order."""
from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shard_utils.errors import InternalError
from shard_utils.media.encode import Encoded, RecordMeta
from shard_utils.sharding import fragments, plan
from shard_utils.sharding.run_plan import SplitLayout


def record(split: str, key: int, name: str, size: int) -> Encoded:
    data = bytes([key % 251]) * size  # distinct per record, so a wrong byte range shows
    return Encoded(split, RecordMeta(key, name, size, (key % 3,), "0" * 64, 1, 1), data)


def plans_for(records: list[Encoded], shards: int) -> dict[str, SplitLayout]:
    """Exact layouts (one run per shard) straight from the records (the job finds the same keys through hash
    buckets)."""
    out = {}
    for split in sorted({r.split for r in records}):
        keys = sorted(r.meta.order for r in records if r.split == split)
        count = min(shards, len(keys))
        starts = plan.shard_starts(len(keys), count)[1:]
        out[split] = SplitLayout(split, len(keys), 0, count, count, boundaries=tuple(keys[s] for s in starts))
    return out


def shards_from(infos, plans, window: int) -> dict:
    grouped: dict = {}
    for info in infos:
        for where, piece in fragments.slices(info, plans):
            grouped.setdefault(where, []).append(piece)
    return {where: [(m.source_id, data) for m, data in fragments.merge(fragments.read_slice(p, window) for p in pieces)]
            for where, pieces in grouped.items()}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["train", "eval"]), st.integers(0, 2**16), st.integers(1, 40)),
                min_size=1, max_size=60, unique_by=lambda t: t[1]),
       st.integers(1, 5), st.integers(1, 4), st.integers(1, 50))
def test_shards_get_every_record_once_in_key_order(tmp_path_factory, monkeypatch, rows, parts, shards, window):
    monkeypatch.setattr(fragments, "META_CHUNK", 4)  # several metadata chunks per fragment, slices across them
    # (the same value for every example: the fixture not being reset between them changes nothing)
    folder = str(tmp_path_factory.mktemp("run"))
    records = [record(split, key, f"{split}/{key}.jpg", size) for split, key, size in rows]
    random.Random(len(rows)).shuffle(records)
    infos = [fragments.write_fragment(folder, f"f{i}", records[i::parts]) for i in range(parts)]
    infos = [i for i in infos if i is not None]
    plans = plans_for(records, shards)
    got = shards_from(infos, plans, window)
    for split, layout in plans.items():
        expect = sorted((r for r in records if r.split == split), key=lambda r: r.meta.order)
        flat = [pair for shard in range(layout.num_shards) for pair in got.get((split, shard), [])]
        assert flat == [(r.meta.source_id, r.framed) for r in expect]
        assert [len(got.get((split, s), [])) for s in range(layout.num_shards)] == \
            plan.shard_sizes(layout.num_listed, layout.num_shards)


@pytest.mark.slow
def test_fragment_info_carries_counts_not_records(tmp_path):
    """What travels through the job per fragment stays small however many records it holds."""
    import pickle

    records = [record("train", k, f"a/{k:06d}-a-long-file-name-from-a-camera.jpg", 10) for k in range(5000)]
    info = fragments.write_fragment(str(tmp_path), "big", records)
    assert [(s.split, s.count, s.num_bytes) for s in info.sections] == [("train", 5000, 50_000)]
    assert len(pickle.dumps(info)) < 2000
    assert [m.source_id for m in info.metas(info.sections[0])] == sorted(r.meta.source_id for r in records)


def test_a_slice_whose_metadata_disagrees_with_its_bytes_is_an_internal_error(tmp_path):
    info = fragments.write_fragment(str(tmp_path), "f", [record("train", k, str(k), 5) for k in range(3)])
    piece = fragments.Slice(info.path, 0, 14, info.meta_range(0, 3))
    with pytest.raises(InternalError, match="does not add up"):
        list(fragments.read_slice(piece, 4))


def test_no_records_write_no_fragment(tmp_path):
    assert fragments.write_fragment(str(tmp_path), "none", []) is None
    assert not list(tmp_path.iterdir())
