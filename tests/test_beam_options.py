"""Beam's options with each view made once: the same values a fresh view would have, through copies too."""
from __future__ import annotations

import copy
import pickle

from apache_beam.options.pipeline_options import DebugOptions, StandardOptions

from beam_jobs.jobs.beam_options import JobOptions


def test_a_view_is_made_once_and_reads_and_writes_the_shared_options():
    opts = JobOptions(["--runner=FnApiRunner", "--experiments=a"])
    standard = opts.view_as(StandardOptions)
    assert opts.view_as(StandardOptions) is standard and standard.runner == "FnApiRunner"
    standard.runner = "DataflowRunner"
    assert opts.get_all_options()["runner"] == "DataflowRunner"
    assert opts.view_as(DebugOptions).experiments == ["a"]


def test_copies_and_pickles_carry_the_values_and_views_of_their_own():
    opts = JobOptions(["--runner=FnApiRunner"])
    opts.view_as(StandardOptions)
    for other in (copy.deepcopy(opts), pickle.loads(pickle.dumps(opts))):
        assert type(other) is JobOptions and other.view_as(StandardOptions).runner == "FnApiRunner"
        other.view_as(StandardOptions).runner = "DataflowRunner"
        assert opts.view_as(StandardOptions).runner == "FnApiRunner"
