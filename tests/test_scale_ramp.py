"""The ramp simulator's small twin: 40 SDK processes on a bucket that starts at 30 reads/s (its 100-worker,
5,000-reads/s run is in docs/dataflow.md). In simulated time, with the project's own throttle and retries."""
from __future__ import annotations

import sys

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO))

from benchmarks.scale_sim.ramp import Job, simulate  # noqa: E402

TWIN = Job(workers=20, processes=2, objects=5000, run_size=100, base_rate=30.0, doubling_s=60.0)


@pytest.fixture(scope="module")
def outcomes():
    return {(policy, stall): simulate(Job(**{**TWIN.__dict__, "policy": policy, "stall_s": stall}))
            for policy in ("throttled", "before") for stall in (0.0, 90.0)}


def test_on_a_bucket_that_ramps_both_policies_read_everything_the_throttled_one_with_fewer_refusals(outcomes):
    throttled, before = outcomes["throttled", 0.0], outcomes["before", 0.0]
    for out in (throttled, before):
        assert out.finished_s is not None and out.objects_read == TWIN.objects and out.bundle_failures == 0
    assert throttled.overloaded / throttled.requests < 0.75 * before.overloaded / before.requests
    assert throttled.requests < 0.6 * before.requests
    assert throttled.max_tries < before.max_tries


def test_when_a_key_range_refuses_for_90_s_only_the_per_object_retries_finish_the_job(outcomes):
    throttled, before = outcomes["throttled", 90.0], outcomes["before", 90.0]
    assert throttled.finished_s is not None and throttled.objects_read == TWIN.objects
    assert throttled.gave_up == throttled.bundle_failures == 0
    assert before.finished_s is None and before.failed_s is not None  # one run failed 4 times: the job failed
    assert before.bundle_failures >= 4 and before.gave_up == before.bundle_failures


def test_the_same_job_gives_the_same_outcome():
    again = simulate(Job(**{**TWIN.__dict__, "objects": 1000}))
    assert again == simulate(Job(**{**TWIN.__dict__, "objects": 1000}))
