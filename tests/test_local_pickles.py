"""Beam's pickles are zlib within `zlib_pickles` (a graph run in this process), bz2 outside it (a graph for remote
workers), and Beam reads both whenever they were made."""
from __future__ import annotations

import base64
import bz2
import zlib

import apache_beam as beam
from apache_beam.internal import cloudpickle_pickler, pickler
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.util import assert_that, equal_to

from beam_jobs.jobs.local_pickles import zlib_pickles


def _scale(x: int, by: int = 3) -> int:
    return x * by


def test_pickles_are_zlib_within_the_block_bz2_outside_and_read_either_way():
    value = {"fn": _scale, "config": list(range(500))}
    outside = pickler.dumps(value)
    with zlib_pickles():
        with zlib_pickles():  # nested: still one layer over Beam's own
            nested = pickler.dumps(value)
        within = pickler.dumps(value)
    after = pickler.dumps(value)
    beams_own = (cloudpickle_pickler.dumps.beams, cloudpickle_pickler.loads.beams)
    assert not any(hasattr(own, "beams") for own in beams_own)
    assert bz2.decompress(base64.b64decode(outside)) == bz2.decompress(base64.b64decode(after))
    assert zlib.decompress(base64.b64decode(within)) == zlib.decompress(base64.b64decode(nested))
    for made in (outside, within, after, within.decode("ascii")):
        assert pickler.loads(made)["fn"](2) == 6 and pickler.loads(made)["config"] == list(range(500))
    coder = pickler.dumps(value, use_zlib=True)  # Beam's coders ask for zlib themselves
    assert pickler.loads(coder, use_zlib=True)["config"][-1] == 499


def test_a_graph_run_within_the_block_gives_what_it_gives_outside():
    def run() -> None:
        with beam.Pipeline(runner=FnApiRunner()) as p:
            out = p | beam.Create([1, 2, 3]) | beam.Map(_scale, by=5) | beam.Map(lambda x: x + 1)
            assert_that(out, equal_to([6, 11, 16]))

    with zlib_pickles():
        run()
    run()
