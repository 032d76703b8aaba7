"""RecordMeta crosses process pipes and Beam's coders several times per record: it must come back whole."""
from __future__ import annotations

import copy
import dataclasses
import pickle

from apache_beam.coders import coders

from shard_utils.media.encode import RecordMeta


def test_record_meta_survives_pickle_copy_and_beams_coder_with_every_field():
    meta = RecordMeta(2**63 - 1, "cat/ünïcode 1.jpg", 30_001, (3, 7), "ab" * 32, 224, 160,
                      (("age", (3,)), ("tags", ("a", "b"))), "0123456789abcdef")
    assert all(getattr(meta, f.name) != f.default for f in dataclasses.fields(RecordMeta))  # nothing left default
    coder = coders.FastPrimitivesCoder()
    for back in (pickle.loads(pickle.dumps(meta)), copy.deepcopy(meta), coder.decode(coder.encode(meta))):
        assert back == meta and type(back) is RecordMeta
        assert [getattr(back, f.name) for f in dataclasses.fields(back)] == \
            [getattr(meta, f.name) for f in dataclasses.fields(meta)]
