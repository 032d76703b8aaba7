"""Reads of 10^7 objects from a fresh bucket, in simulated time: does a Dataflow job ride Cloud Storage's ramp?

    python benchmarks/scale_sim/ramp.py [--objects 10000000] [--workers 10,25,50,100] [--policy both]

A discrete-event simulation (an event queue and a clock; nothing sleeps) of the encode step's source reads on
Dataflow. W workers run P SDK processes each; a process encodes one run (about 850 objects, a 128 MB shard of
150 KB photos) at a time, reading as `shard_utils.media.reads.prefetched` does: 16 reads in flight on the
process's pool of 16 threads, handed out in order, the next one submitted once the oldest is encoded. The
bucket starts at 5,000 reads/s and doubles every 20 minutes (Cloud Storage's request-rate guidelines); above
its current rate it answers 429 or 503. Every answer takes 30-80 ms. With --stall-s, Cloud Storage's moving of
load to more servers ("on the order of minutes", the same guidelines) is modelled too: after each doubling,
one of 16 key ranges refuses every read for that long.

What each process does is decided by the project's own objects, on a clock the simulation moves: the
`Throttle` and `RetryPolicy` of `shard_utils.storage.throttle`, with the settings the reads use in
`shard_utils.storage._gcs`. Two policies:
  throttled  the reads now: a throttle per process, each object retried on its own (READ_POLICY)
  before     the reads before it: no throttle, each read retried by the client library for 60 s
             (DEFAULT_RETRY's backoff), a run failing as soon as one of its reads does
A failed run is a failed bundle: it is tried again, and a run that fails 4 times fails the job.
Not simulated: listing, writing, worker start-up and autoscaling, requests of other jobs on the bucket.
"""
from __future__ import annotations

import argparse
import heapq
import random
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from shard_utils.media.reads import READS_IN_FLIGHT  # noqa: E402
from shard_utils.storage import _gcs  # noqa: E402
from shard_utils.storage.throttle import RetryPolicy, Throttle  # noqa: E402

BUNDLE_ATTEMPTS = 4  # Dataflow fails a batch job when one bundle fails this many times


def before_policy() -> RetryPolicy:
    """The client library's retry the reads had before (`_gcs.DEFAULT_RETRY`): 0.25 s doubling to 4 s, 60 s."""
    retry = _gcs.DEFAULT_RETRY
    return RetryPolicy(initial_s=retry._initial, maximum_s=retry._maximum, multiplier=retry._multiplier,
                       budget_s=retry._timeout)


@dataclass(frozen=True)
class Job:
    """What is simulated: the job's shape, the bucket's ramp and the answers' latency."""

    workers: int = 100
    processes: int = 4  # SDK processes per worker (one per vCPU of an n2-standard-4)
    in_flight: int = READS_IN_FLIGHT
    objects: int = 10_000_000
    run_size: int = 850
    encode_ms: float = 0.72  # CPU per object once read (pass-through with --validate decode: 1,395 per second)
    base_rate: float = 5000.0  # reads per second a fresh bucket serves
    doubling_s: float = 1200.0
    burst_s: float = 1.0  # the bucket's allowance, in seconds of its current rate
    latency_ms: tuple[float, float] = (30.0, 80.0)
    stall_s: float = 0.0  # after each doubling, one key range of `key_ranges` refuses every read this long
    key_ranges: int = 16
    policy: str = "throttled"
    limit_s: float = 6 * 3600.0  # simulated time after which a job that has not finished is stopped
    seed: int = 1


@dataclass
class Outcome:
    job: Job
    finished_s: float | None = None  # when the last run was encoded
    failed_s: float | None = None  # when a run failed for the 4th time (the job failed)
    requests: int = 0
    overloaded: int = 0  # answered 429/503
    max_tries: int = 0  # of an object that was read
    gave_up: int = 0  # objects still failing when their retry budget was spent
    bundle_failures: int = 0
    reads_redone: int = 0  # reads of runs that failed, done again
    throttled_s: float = 0.0  # reads held back by a throttle or backing off after 429/503, summed over reads
    objects_read: int = 0
    end_rate: float = 0.0  # reads per second the bucket served at the end
    events: int = 0
    cpu_s: float = field(default=0.0, compare=False)  # what simulating took, not an outcome
    tries_seen: dict[int, int] = field(default_factory=dict)


class _Bucket:
    """A token bucket whose rate doubles every `doubling_s`: a request without a token is answered 429/503."""

    def __init__(self, job: Job):
        self.job, self.tokens, self.at = job, job.base_rate * job.burst_s, 0.0

    def rate(self, now: float) -> float:
        return self.job.base_rate * 2.0 ** (now / self.job.doubling_s)

    def stalled(self, now: float) -> int | None:
        """The key range that refuses everything now, if any: one moving its load to more servers."""
        step, into = divmod(now, self.job.doubling_s)
        return int(step) % self.job.key_ranges if step >= 1 and into < self.job.stall_s else None

    def take(self, now: float) -> bool:
        rate = self.rate(now)
        self.tokens = min(rate * self.job.burst_s, self.tokens + (now - self.at) * rate)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


class _Read:
    __slots__ = ("proc", "token", "index", "key_range", "tries", "attempts", "first_sent")

    def __init__(self, proc, token, index, key_range):
        self.proc, self.token, self.index, self.key_range = proc, token, index, key_range
        self.tries, self.attempts, self.first_sent = None, 0, None


class _Process:
    """One SDK process: its throttle, its pool of read threads and the run it encodes."""

    __slots__ = ("throttle", "rng", "free", "waiting", "run", "token", "head", "next", "state", "busy")

    def __init__(self, job: Job, clock, seed: int):
        self.rng = random.Random(seed)
        throttled = _gcs.READ_THROTTLE
        self.throttle = Throttle(overload_ratio=throttled.overload_ratio, delay_s=throttled.delay_s, clock=clock,
                                 rng=self.rng)
        self.free, self.waiting = job.in_flight, deque()
        self.run = self.token = None
        self.head = self.next = 0
        self.state = bytearray()  # per object of the run: 0 reading, 1 read, 2 given up
        self.busy = False


_ATTEMPT, _ANSWER, _ENCODED = 0, 1, 2


class _Simulation:
    def __init__(self, job: Job):
        if job.policy not in ("throttled", "before"):
            raise ValueError(f"policy must be throttled or before, not {job.policy!r}")
        self.job, self.out = job, Outcome(job)
        self.now, self.seq, self.events = 0.0, 0, []
        self.bucket = _Bucket(job)
        self.throttled = job.policy == "throttled"
        self.policy = _gcs.READ_POLICY if self.throttled else before_policy()
        self.rng = random.Random(job.seed)
        self.lat_lo, self.lat_span = job.latency_ms[0] / 1000, (job.latency_ms[1] - job.latency_ms[0]) / 1000
        sizes = [job.run_size] * (job.objects // job.run_size) + ([job.objects % job.run_size] if
                                                                  job.objects % job.run_size else [])
        self.runs = deque([i, size, 0] for i, size in enumerate(sizes))  # [run, objects, failures]
        self.left = len(sizes)
        clock = self.clock
        self.procs = [_Process(job, clock, job.seed * 100_003 + i) for i in range(job.workers * job.processes)]

    def clock(self) -> float:
        return self.now

    def push(self, at: float, kind: int, what) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, kind, what))

    def run(self) -> Outcome:
        started = time.process_time()
        for proc in self.procs:
            self.take_run(proc)
        events, out, limit = self.events, self.out, self.job.limit_s
        while events and out.finished_s is None and out.failed_s is None:
            at, _, kind, what = heapq.heappop(events)
            if at > limit:
                break
            self.now = at
            out.events += 1
            if kind == _ANSWER:
                self.answer(*what)
            elif kind == _ATTEMPT:
                self.attempt(what)
            else:
                self.encoded(what)
        out.end_rate = self.bucket.rate(self.now)
        out.cpu_s = time.process_time() - started
        return out

    # ---------------------------------------------------------------------------------------- a process's run

    def take_run(self, proc: _Process) -> None:
        if not self.runs:
            proc.run = proc.token = None
            return
        proc.run = run = self.runs.popleft()
        proc.token = object()
        proc.head = proc.next = 0
        proc.state = bytearray(run[1])
        while proc.next < min(self.job.in_flight, run[1]):
            self.submit(proc)

    def submit(self, proc: _Process) -> None:
        read = _Read(proc, proc.token, proc.next, (proc.run[0] * 1_000_003 + proc.next) % self.job.key_ranges)
        proc.next += 1
        if proc.free:
            proc.free -= 1
            self.attempt(read)
        else:
            proc.waiting.append(read)

    def release(self, proc: _Process) -> None:
        if proc.waiting:
            self.attempt(proc.waiting.popleft())
        else:
            proc.free += 1

    def deliver(self, read: _Read, state: int) -> None:
        proc = read.proc
        if read.token is not proc.token:  # a read of a run that failed: its thread finishes, its bytes unused
            return
        proc.state[read.index] = state
        if read.index == proc.head and not proc.busy:
            self.consume(proc)

    def consume(self, proc: _Process) -> None:
        if proc.state[proc.head] == 2:  # prefetched raises the read's error when its turn comes
            self.run_failed(proc)
            return
        proc.busy = True
        self.push(self.now + self.job.encode_ms / 1000, _ENCODED, proc)

    def encoded(self, proc: _Process) -> None:
        proc.busy = False
        proc.head += 1
        size = proc.run[1]
        if proc.next < size:
            self.submit(proc)
        if proc.head == size:
            self.out.objects_read += size
            self.left -= 1
            if not self.left:
                self.out.finished_s = self.now
            self.take_run(proc)
        elif proc.state[proc.head]:
            self.consume(proc)

    def run_failed(self, proc: _Process) -> None:
        out, run = self.out, proc.run
        out.bundle_failures += 1
        out.reads_redone += proc.head
        run[2] += 1
        if run[2] >= BUNDLE_ATTEMPTS:
            out.failed_s = self.now
            return
        self.runs.appendleft(run)
        self.take_run(proc)

    # ---------------------------------------------------------------------------------------------- a read

    def attempt(self, read: _Read) -> None:
        proc = read.proc
        if self.throttled and not proc.throttle.admit():
            delay = proc.throttle.hold()
            self.out.throttled_s += delay
            self.push(self.now + delay, _ATTEMPT, read)
            return
        self.out.requests += 1
        read.attempts += 1
        if read.first_sent is None:
            read.first_sent = self.now
        stalled = self.job.stall_s and read.key_range == self.bucket.stalled(self.now)
        served = not stalled and self.bucket.take(self.now)
        self.push(self.now + self.lat_lo + self.rng.random() * self.lat_span, _ANSWER, (read, served))

    def answer(self, read: _Read, served: bool) -> None:
        proc, out = read.proc, self.out
        if self.throttled:
            proc.throttle.answered(served)
        if served:
            out.tries_seen[read.attempts] = out.tries_seen.get(read.attempts, 0) + 1
            if read.attempts > out.max_tries:
                out.max_tries = read.attempts
            self.release(proc)
            self.deliver(read, 1)
            return
        out.overloaded += 1
        if read.tries is None:  # the new policy's budget runs from the first failure, the library's from the call
            read.tries = self.policy.tries(self.now if self.throttled else read.first_sent, proc.rng)
        wait = read.tries.wait_after_failure(self.now)
        if wait is None:
            out.gave_up += 1
            self.release(proc)
            self.deliver(read, 2)
            return
        out.throttled_s += wait
        self.push(self.now + wait, _ATTEMPT, read)


def simulate(job: Job) -> Outcome:
    """Run one job to its end (or its failure, or job.limit_s of simulated time)."""
    return _Simulation(job).run()


def _minutes(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 60:.1f}"


HEADER = ("| policy | workers x processes x reads in flight | objects | read all in (min) | requests | "
          "answered 429/503 | most tries of an object | objects given up | bundle failures | job | "
          "reads waiting (read-hours) |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")


def row(out: Outcome) -> str:
    job = out.job
    verdict = (f"finished at {_minutes(out.finished_s)} min" if out.finished_s is not None else
               f"failed at {_minutes(out.failed_s)} min (a bundle failed {BUNDLE_ATTEMPTS} times)"
               if out.failed_s is not None else f"stopped at {_minutes(job.limit_s)} min")
    share = out.overloaded / out.requests if out.requests else 0.0
    return (f"| {job.policy} | {job.workers} x {job.processes} x {job.in_flight} | {job.objects:,} | "
            f"{_minutes(out.finished_s)} | {out.requests:,} | {share:.1%} | {out.max_tries} | {out.gave_up:,} | "
            f"{out.bundle_failures:,} | {verdict} | {out.throttled_s / 3600:,.1f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=10_000_000)
    parser.add_argument("--workers", default="100", help="worker counts, comma-separated (e.g. 10,25,50,100)")
    parser.add_argument("--processes", type=int, default=4, help="SDK processes per worker")
    parser.add_argument("--in-flight", type=int, default=READS_IN_FLIGHT, help="reads in flight per process")
    parser.add_argument("--policy", choices=("throttled", "before", "both"), default="both")
    parser.add_argument("--encode-ms", type=float, default=Job.encode_ms, help="CPU per object once read")
    parser.add_argument("--stall-s", type=float, default=0.0,
                        help="after each doubling, one of 16 key ranges refuses every read this long")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    try:
        workers = [int(w) for w in args.workers.split(",")]
    except ValueError:
        parser.error(f"--workers: {args.workers!r} is not a list of whole numbers")
    if min(workers) < 1 or args.objects < 1 or args.processes < 1 or args.in_flight < 1:
        parser.error("workers, objects, processes and reads in flight must be at least 1")
    if args.encode_ms < 0 or args.stall_s < 0:
        parser.error("--encode-ms and --stall-s must be at least 0")
    policies = ("throttled", "before") if args.policy == "both" else (args.policy,)
    print(HEADER, flush=True)
    for policy in policies:
        for count in workers:
            out = simulate(Job(workers=count, processes=args.processes, in_flight=args.in_flight,
                               objects=args.objects, encode_ms=args.encode_ms, policy=policy, seed=args.seed,
                               stall_s=args.stall_s))
            print(row(out), flush=True)
            print(f"  ({out.events:,} events in {out.cpu_s:.0f} CPU-s; the bucket served "
                  f"{out.end_rate:,.0f} reads/s at the end)", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
