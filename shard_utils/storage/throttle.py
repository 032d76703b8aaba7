"""Reads that ride a request-rate limit: client-side throttling per process and retries per object (no Beam).

`Throttle` is the adaptive throttling of Beam's `AdaptiveThrottler` (the SRE book's client-side throttling):
a process whose requests of the last two minutes were refused for load (429/503) more than once in five
holds back its next request with probability (requests - K x accepts) / (requests + 1), K = 1.25: the more
of its requests are refused, the fewer it sends. `RetryPolicy` gives one object its own tries: exponential
backoff with full jitter, given up only when the object still fails `budget_s` after its first failure, so
one throttled object never fails the others. `with_retries` joins the two around one request. Clocks, sleeps
and randomness are parameters: the scale simulator drives these same objects in simulated time.
"""
from __future__ import annotations

import math
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from shard_utils.errors import TpuShardsError

__all__ = ["T", "Clock", "Throttle", "RetryPolicy", "Tries", "GaveUp", "Waited", "with_retries"]

T = TypeVar("T")
Clock = Callable[[], float]


class _MovingSum:
    """A count over the last `window_s` seconds, kept in buckets of `bucket_s`."""

    def __init__(self, window_s: float, bucket_s: float):
        if not 0 < bucket_s <= window_s:
            raise ValueError("window_s >= bucket_s > 0 please")
        self._buckets = math.ceil(window_s / bucket_s)
        self._bucket_s = bucket_s
        self._counts: deque[list[int]] = deque()  # [bucket index, count], oldest first
        self._total = 0

    def _current(self, now: float) -> int:
        current = int(now // self._bucket_s)
        oldest = current - self._buckets + 1
        while self._counts and self._counts[0][0] < oldest:
            self._total -= self._counts.popleft()[1]
        return current

    def add(self, now: float, n: int = 1) -> None:
        current = self._current(now)
        if self._counts and self._counts[-1][0] == current:
            self._counts[-1][1] += n
        else:
            self._counts.append([current, n])
        self._total += n

    def sum(self, now: float) -> int:
        self._current(now)
        return self._total


class Throttle:
    """Client-side adaptive throttling shared by every request of a process: ask `admit()` before each
    request (False: wait `hold()` seconds and ask again), and say how each request sent was answered.

    The odds are Beam's over the requests sent; what is counted differs. Beam counts a request when it is
    asked for, held back or not, which suits one caller that drops what is held. Here 16 reads are in flight
    (16 requests before any answer would hold a process back from its start) and a held read asks again a
    second later (counting every ask, one burst of refusals holds a process back for tens of minutes: the
    share let through grows only by K per window). So a request counts when its answer comes, and the share
    held back follows the share the server refuses: none below one in five."""

    MIN_REQUESTS = 1  # the +1 of the formula: some requests always go, even when none succeeds

    def __init__(self, *, window_s: float = 120.0, bucket_s: float = 1.0, overload_ratio: float = 1.25,
                 delay_s: float = 1.0, clock: Clock = time.monotonic, rng: random.Random | None = None):
        if overload_ratio < 1 or delay_s <= 0:
            raise ValueError("overload_ratio must be at least 1 and delay_s above 0")
        self._requests = _MovingSum(window_s, bucket_s)
        self._accepts = _MovingSum(window_s, bucket_s)
        self.overload_ratio, self.delay_s = float(overload_ratio), float(delay_s)
        self.clock = clock
        self._rng = rng or random.Random()
        self._lock = threading.Lock()

    def probability(self) -> float:
        """The chance that the next request is held back, from the last window's requests and accepts."""
        with self._lock:
            return self._probability(self.clock())

    def _probability(self, now: float) -> float:
        requests = self._requests.sum(now)
        return max(0.0, (requests - self.overload_ratio * self._accepts.sum(now)) / (requests + self.MIN_REQUESTS))

    def hold(self) -> float:
        """Seconds to wait before asking again after admit() said no: delay_s, +-50 % at random so that the
        requests held at once do not all come back at once."""
        return self.delay_s * (0.5 + self._rng.random())

    def admit(self) -> bool:
        """Whether to send a request now; one held back is not counted (it asks again after hold())."""
        with self._lock:
            now = self.clock()
            return self._rng.random() >= self._probability(now)

    def answered(self, served: bool) -> None:
        """A request sent was answered: served, or refused for the server's load (429/503)."""
        with self._lock:
            now = self.clock()
            self._requests.add(now)
            if served:
                self._accepts.add(now)


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter (waits drawn from [0, cap), the cap growing from `initial_s` by
    `multiplier` up to `maximum_s`), given up when the next try would start more than `budget_s` after
    `started` (the object's first failure)."""

    initial_s: float = 0.5
    maximum_s: float = 16.0
    multiplier: float = 2.0
    budget_s: float = 600.0

    def __post_init__(self):
        if not (0 < self.initial_s <= self.maximum_s and self.multiplier >= 1 and self.budget_s >= 0):
            raise ValueError(f"not a retry policy: {self}")

    def tries(self, started: float, rng: random.Random | None = None) -> Tries:
        return Tries(self, started, rng or random.Random())


class Tries:
    """One object's failures under a policy: how long to wait after each, until its budget is spent."""

    def __init__(self, policy: RetryPolicy, started: float, rng: random.Random):
        self.policy, self.started, self._rng = policy, started, rng
        self.failures = 0
        self._cap = policy.initial_s

    def wait_after_failure(self, now: float) -> float | None:
        """Seconds to wait before the next try, or None: the budget is spent, give up."""
        self.failures += 1
        wait = self._rng.uniform(0.0, self._cap)
        self._cap = min(self._cap * self.policy.multiplier, self.policy.maximum_s)
        if now + wait > self.started + self.policy.budget_s:
            return None
        return wait


class GaveUp(RuntimeError, TpuShardsError):
    """A request still failed when its object's retry budget was spent; `last` is its last failure."""

    def __init__(self, last: BaseException, tries: int, seconds: float):
        super().__init__(f"{last} (failed {tries} tries over {seconds:.0f} s)")
        self.last, self.tries, self.seconds = last, tries, seconds


class Waited:
    """How long a unit of work (a run) had reads held back by the throttle or backing off after an overload
    answer (429/503), counted once however many of its reads waited at the same time (so never more than its
    wall time, as one thread's waits would be), and how many tries were repeated. Shared by its threads."""

    def __init__(self, clock: Clock = time.monotonic):
        self._lock, self._clock = threading.Lock(), clock
        self._waiting, self._since = 0, 0.0
        self.seconds = 0.0
        self.retries = 0

    def wait(self, sleep: Callable[[float], None], seconds: float) -> None:
        """sleep(seconds), counted as throttled."""
        with self._lock:
            if not self._waiting:
                self._since = self._clock()
            self._waiting += 1
        try:
            sleep(seconds)
        finally:
            with self._lock:
                self._waiting -= 1
                if not self._waiting:
                    self.seconds += self._clock() - self._since

    def retried(self) -> None:
        with self._lock:
            self.retries += 1


def with_retries(send: Callable[[], T], *, transient: Callable[[BaseException], bool],
                 overloaded: Callable[[BaseException], bool], throttle: Throttle, policy: RetryPolicy,
                 waited: Waited | None = None, sleep: Callable[[float], None] = time.sleep,
                 rng: random.Random | None = None) -> T:
    """send() under the throttle, tried again after a transient failure until the policy gives up (GaveUp).
    Any other exception is raised at once."""
    clock = throttle.clock
    waited = waited or Waited(clock)
    tries: Tries | None = None
    while True:
        while not throttle.admit():
            waited.wait(sleep, throttle.hold())
        try:
            value = send()
        except Exception as exc:
            busy = overloaded(exc)
            throttle.answered(served=not busy)
            if not transient(exc):
                raise
            tries = tries or policy.tries(clock(), rng)
            wait = tries.wait_after_failure(clock())
            if wait is None:
                raise GaveUp(exc, tries.failures, clock() - tries.started) from exc
            waited.retried()
            if busy:
                waited.wait(sleep, wait)
            else:  # a reset or a 500 is not the bucket's load: waited out, not counted as throttled
                sleep(wait)
            continue
        throttle.answered(served=True)
        return value
