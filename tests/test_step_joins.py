"""WithSingleton, Joined and collected on their own: the joins that stand in for side inputs; Chunk and Chained,
how many small elements travel as one."""
from __future__ import annotations

import pickle
import subprocess
import sys

import apache_beam as beam
from apache_beam.testing.util import assert_that, equal_to
from conftest import REPO
from steps import pipeline, run

from beam_jobs.pipeline.chunks import Chained, Chunk
from beam_jobs.pipeline.common import Joined, WithSingleton, collected, singleton_pairs
from shard_utils.inputs import MediaItem
from shard_utils.inputs.items import MediaItems
from shard_utils.sharding.encode_run import RunTask


def sorted_lists(found: dict) -> dict:
    return {name: sorted(values) for name, values in found.items()}


def test_with_singleton_pairs_every_element_with_the_one_value():
    p = pipeline()
    pairs = p | "Xs" >> beam.Create(range(40)) | WithSingleton(p | "One" >> beam.Create(["plan"]), fanout=3)
    assert_that(pairs, equal_to([(x, "plan") for x in range(40)]))
    run(p)


def test_with_singleton_gives_nothing_when_the_singleton_is_empty():
    p = pipeline()
    pairs = p | "Xs" >> beam.Create(range(5)) | WithSingleton(p | "None" >> beam.Create([]))
    assert_that(pairs, equal_to([]))
    run(p)


def test_joined_gives_one_dict_of_every_value_empty_inputs_included():
    p = pipeline()
    found = {"shards": p | "A" >> beam.Create([3, 1, 2]), "cross_split": p | "B" >> beam.Create([]),
             "run": p | "C" >> beam.Create(["r"])} | Joined()
    assert_that(found | beam.Map(sorted_lists), equal_to([{"shards": [1, 2, 3], "cross_split": [], "run": ["r"]}]))
    run(p)


def test_collected_passes_a_tagged_output_through_unchanged():
    p = pipeline()
    parts = (p | beam.Create([1, 2, 3])
             | beam.FlatMap(lambda x: [x] if x % 2 else [beam.pvalue.TaggedOutput("even", x)]).with_outputs(
                 "even", main="odd"))
    assert_that(collected(parts.odd, "Odd"), equal_to([1, 3]), label="Odd values")
    assert_that(collected(parts.even, "Even"), equal_to([2]), label="Even values")
    run(p)


def test_a_chunk_reads_as_the_sequence_it_was_made_from_after_any_number_of_trips():
    items = [MediaItem(f"a/{i}.jpg", f"/in/a/{i}.jpg", i, ("a",)) for i in range(50)]
    chunk = Chunk(items)
    packed = pickle.dumps(chunk)
    assert pickle.dumps(chunk) == packed  # the items are pickled once; later trips reuse the bytes
    back = pickle.loads(pickle.dumps(pickle.loads(packed)))
    assert back == items and list(back) == items and len(back) == 50 and back[7] == items[7]
    assert [x.size for x in back] == list(range(50)) and back != items[:-1] and Chunk() == []


def test_a_run_chained_from_its_chunks_reaches_a_worker_as_their_bytes_and_imports_no_beam():
    """A run's items go to a worker process as the bytes its chunks came with (not pickled again item by item);
    the worker, which imports no Beam, reads them in order."""
    items = [MediaItem(f"a/{i}.jpg", f"/in/a/{i}.jpg", i, ("a",)) for i in range(30)]
    chunks = [pickle.loads(pickle.dumps(MediaItems(items[k:k + 8]))) for k in range(0, 30, 8)]  # as GroupRuns does
    task = RunTask("train", 3, Chained(chunks))
    sent = pickle.dumps(task)
    assert all(chunk._packed in sent for chunk in chunks) and pickle.dumps(task) == sent
    assert task.items == items and len(task.items) == 30 and task.items[9] == items[9]
    read = ("import pickle, sys; task = pickle.loads(sys.stdin.buffer.read()); "
            "print([i.size for i in task.items], len(task.items), 'apache_beam' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", read], input=sent, capture_output=True, cwd=REPO, timeout=60,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.decode().strip() == f"{list(range(30))} 30 False"


def test_chunks_cross_a_group_by_key_whole():
    p = pipeline()
    grouped = (p | beam.Create([("k", Chunk([(1, "a"), (2, "b")])), ("k", Chunk([(3, "c")]))])
               | beam.GroupByKey()
               | beam.MapTuple(lambda k, chunks: (k, sorted(x for chunk in chunks for x in chunk))))
    assert_that(grouped, equal_to([("k", [(1, "a"), (2, "b"), (3, "c")])]))
    run(p)


def test_singleton_pairs_read_a_keys_values_again_rather_than_keep_them():
    values = [(False, x) for x in range(6)] + [(True, "plan")] + [(False, 6)]
    walked = []

    class Reiterable:
        def __iter__(self):
            walked.append(1)
            return iter(values)

    assert list(singleton_pairs((0, Reiterable()))) == [(x, "plan") for x in range(7)]
    assert len(walked) == 2
    assert list(singleton_pairs((0, [(False, 1), (False, 2)]))) == []
