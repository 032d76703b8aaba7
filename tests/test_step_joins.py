"""WithSingleton, Joined and collected on their own: the joins that stand in for side inputs."""
from __future__ import annotations

import apache_beam as beam
from apache_beam.testing.util import assert_that, equal_to
from steps import pipeline, run

from beam_jobs.pipeline.common import Joined, WithSingleton, collected


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
