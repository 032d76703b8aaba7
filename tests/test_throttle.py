"""Client-side throttling and per-object retries on a clock the test moves: what is held back, what is waited,
when an object is given up, and that the throttle's odds are those of Beam's AdaptiveThrottler."""
from __future__ import annotations

import random
import threading

import pytest
import requests
from google.api_core import exceptions as api

from shard_utils.storage import _gcs
from shard_utils.storage.throttle import GaveUp, RetryPolicy, Throttle, Waited, with_retries


class Clock:
    """Time that moves only when the code under test sleeps (or the test says so)."""

    def __init__(self, now: float = 1000.0):
        self.now = now
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_nothing_is_held_back_while_the_server_serves_what_is_sent_even_with_many_reads_in_flight():
    clock = Clock()
    throttle = Throttle(clock=clock, rng=random.Random(1))
    for _ in range(500):
        assert all(throttle.admit() for _ in range(16))  # 16 sent before any answer comes
        clock.now += 0.05
        for _ in range(16):
            throttle.answered(served=True)
    assert throttle.probability() == 0.0


def test_against_a_server_that_serves_100_a_second_a_process_asking_1000_sends_a_third_of_that():
    """A process asking 1,000 times a second of a server that serves 100 holds back p = 1 - K x served / sent
    of its requests: it settles where sent^2 = K x served x asked, about 354 a second, and a window after the
    server serves everything again, nothing is held back."""
    clock = Clock()
    throttle = Throttle(clock=clock, rng=random.Random(7), overload_ratio=1.25)
    sent_per_second = []
    for second in range(200):
        sent = served = 0
        for i in range(1000):
            clock.now = 1000.0 + second + i / 1000
            if throttle.admit():
                sent += 1
                throttle.answered(served=served < 100)
                served += 1
        sent_per_second.append(sent)
    steady = sent_per_second[130:]  # past the first two-minute window
    assert 330 <= sum(steady) / len(steady) <= 380, sum(steady) / len(steady)
    assert sent_per_second[0] < 500  # it holds back within the first second of refusals
    for _ in range(1000):  # the server serves everything from now on
        clock.now += 0.121
        throttle.answered(served=True)
    assert throttle.probability() == 0.0 and throttle.admit()


def test_the_odds_are_those_of_beams_adaptive_throttler_over_the_requests_sent():
    """The same requests and successes give the same odds; ours counts a request when it is answered."""
    from apache_beam.io.components.adaptive_throttler import AdaptiveThrottler

    beam = AdaptiveThrottler(window_ms=120_000, bucket_ms=1000, overload_ratio=1.25)
    clock = Clock(0.0)
    ours = Throttle(clock=clock, rng=random.Random(3))
    rng, highest = random.Random(5), 0.0
    for step in range(3000):
        now_ms = step * 100 + 37  # never on a bucket's edge, where the two put a request in adjacent buckets
        clock.now = now_ms / 1000
        assert ours.probability() == pytest.approx(beam._throttling_probability(now_ms), abs=1e-12), step
        highest = max(highest, ours.probability())
        served = rng.random() < 0.3 + 0.6 * (step > 1500)
        beam.throttle_request(now_ms)
        if served:
            beam.successful_request(now_ms)
        ours.answered(served)
    assert ours.probability() == 0.0 and highest > 0.5  # 70 % refused, then 10 %


def test_backoff_waits_grow_with_jitter_and_the_object_is_given_up_after_its_budget():
    policy = RetryPolicy(initial_s=0.5, maximum_s=4.0, multiplier=2.0, budget_s=60.0)
    tries = policy.tries(started=100.0, rng=random.Random(11))
    now, caps, waits = 100.0, [], []
    while (wait := tries.wait_after_failure(now)) is not None:
        waits.append(wait)
        caps.append(min(0.5 * 2 ** (len(waits) - 1), 4.0))
        now += wait + 0.05  # the next try's answer
    assert all(0 <= w < cap for w, cap in zip(waits, caps, strict=True))
    assert len(waits) >= 20 and now - 100.0 <= 60.0 + 4.0  # tries go on for about the budget, not past it
    assert tries.failures == len(waits) + 1
    again = [policy.tries(100.0, random.Random(11)).wait_after_failure(100.0) for _ in range(2)]
    assert again[0] == again[1] == waits[0]  # seeded: the same waits


@pytest.mark.parametrize("bad", [dict(initial_s=0), dict(initial_s=5, maximum_s=1), dict(multiplier=0.5),
                                 dict(budget_s=-1)])
def test_a_policy_that_cannot_work_is_refused(bad):
    with pytest.raises(ValueError):
        RetryPolicy(**bad)


def failing(*errors: BaseException, value: bytes = b"data"):
    """A send() that raises each error in turn, then returns value; counts its calls."""
    left = list(errors)
    calls = []

    def send() -> bytes:
        calls.append(1)
        if left:
            raise left.pop(0)
        return value

    return send, calls


def refused(clock: Clock, fraction: float, seed: int = 2) -> Throttle:
    """A throttle whose process had that fraction of its last 1,000 requests refused for load."""
    throttle = Throttle(clock=clock, rng=random.Random(seed))
    for i in range(1000):
        throttle.answered(served=i >= 1000 * fraction)
    return throttle


def retried(send, clock: Clock, policy: RetryPolicy | None = None, throttle: Throttle | None = None,
            waited: Waited | None = None):
    return with_retries(send, transient=_gcs.transient, overloaded=_gcs.overloaded,
                        throttle=throttle or refused(clock, 0.0), policy=policy or RetryPolicy(), waited=waited,
                        sleep=clock.sleep, rng=random.Random(4))


def test_an_object_answered_429_and_503_is_tried_again_and_its_wait_is_counted_as_throttled():
    clock = Clock()
    waited = Waited(clock)
    send, calls = failing(api.TooManyRequests("slow down"), api.ServiceUnavailable("busy"),
                          requests.ConnectionError("reset"))
    assert retried(send, clock, waited=waited) == b"data"
    assert len(calls) == 4 and len(clock.slept) == 3 and waited.retries == 3
    assert waited.seconds == pytest.approx(sum(clock.slept[:2]))  # the reset is retried, not counted as throttling


def test_a_process_whose_tries_are_refused_holds_its_next_tries_back():
    clock = Clock()
    waited = Waited(clock)
    send, calls = failing(*[api.TooManyRequests("slow down")] * 5)
    throttle = Throttle(clock=clock, rng=random.Random(2), delay_s=10.0)  # holds of 5-15 s; backoff here is < 8 s
    assert retried(send, clock, throttle=throttle, waited=waited) == b"data"
    held = [s for s in clock.slept if s >= 5.0]
    assert len(calls) == 6 and len(clock.slept) == 5 + len(held) and len(held) >= 2
    assert waited.seconds == pytest.approx(sum(clock.slept)) and waited.retries == 5


@pytest.mark.parametrize("error", [api.NotFound("gone"), api.Forbidden("denied"), api.BadRequest("bad")])
def test_a_definite_answer_is_not_tried_again(error):
    clock = Clock()
    send, calls = failing(error)
    with pytest.raises(type(error)):
        retried(send, clock)
    assert len(calls) == 1 and clock.slept == []


def test_an_object_that_keeps_failing_is_given_up_with_its_last_answer_and_tries():
    clock = Clock()
    policy = RetryPolicy(initial_s=1.0, maximum_s=8.0, budget_s=120.0)
    send, calls = failing(*[api.ServiceUnavailable("still busy")] * 1000)
    with pytest.raises(GaveUp) as raised:
        retried(send, clock, policy)
    assert isinstance(raised.value.last, api.ServiceUnavailable) and raised.value.tries == len(calls)
    assert 10 < len(calls) < 100 and 100.0 <= raised.value.seconds <= 120.0
    assert str(raised.value).endswith(f"(failed {len(calls)} tries over {raised.value.seconds:.0f} s)")


def test_a_process_whose_requests_were_refused_holds_the_next_ones_back_and_counts_the_wait():
    clock = Clock()
    throttle = refused(clock, 0.9, seed=1)  # 90 % refused: (1000 - 1.25 x 100) / 1001 of the next requests wait
    assert throttle.probability() == pytest.approx(875 / 1001)
    waited = Waited(clock)
    send, _ = failing()
    assert retried(send, clock, throttle=throttle, waited=waited) == b"data"
    assert clock.slept and all(0.5 <= s < 1.5 for s in clock.slept)  # held 1 s +-50 %, then sent
    assert waited.seconds == pytest.approx(sum(clock.slept)) and waited.retries == 0


def test_reads_waiting_at_the_same_time_count_once():
    """Throttled time is how long a run had reads waiting, as one thread's waits would count, not their sum."""
    clock = Clock()
    waited = Waited(clock)
    ready, done = threading.Barrier(3), threading.Event()

    def sleep(seconds: float) -> None:
        ready.wait(timeout=10)  # both reads are waiting now
        done.wait(timeout=10)

    readers = [threading.Thread(target=waited.wait, args=(sleep, 5.0)) for _ in range(2)]
    for t in readers:
        t.start()
    ready.wait(timeout=10)
    clock.now += 5.0
    done.set()
    for t in readers:
        t.join(timeout=10)
    assert waited.seconds == 5.0


def test_a_process_whose_requests_are_refused_at_less_than_one_in_five_holds_nothing_back():
    clock = Clock()
    assert refused(clock, 0.19).probability() == 0.0


@pytest.mark.parametrize("error, transient, overloaded", [
    (api.TooManyRequests("x"), True, True), (api.ServiceUnavailable("x"), True, True),
    (api.InternalServerError("x"), True, False), (api.GatewayTimeout("x"), True, False),
    (requests.ConnectionError("x"), True, False), (requests.Timeout("x"), True, False),
    (api.NotFound("x"), False, False), (api.Forbidden("x"), False, False), (ValueError("x"), False, False)])
def test_which_failures_may_pass_and_which_say_the_server_is_busy(error, transient, overloaded):
    assert (_gcs.transient(error), _gcs.overloaded(error)) == (transient, overloaded)
