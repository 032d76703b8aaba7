"""What every step shares: the job's counters, outputs from finish_bundle, and running a function for each
element inline or in the local build's worker processes."""
from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindows

from beam_jobs.local.pool import Crashed, Done, LocalPool, Outcome, Raised
from beam_jobs.run.tally import NAMESPACE

__all__ = [
    "Keyed", "SINGLETON_FANOUT", "count", "rejected", "collected", "WithSingleton", "singleton_pairs", "Joined",
    "windowed", "PooledDoFn"
]

Keyed = tuple  # (split, order key, MediaItem): an item keyed for its run, from PlanLayout to EncodeRuns
SINGLETON_FANOUT = 64  # keys WithSingleton spreads its input over (each gets a copy of the singleton)


def count(name: str, n: int = 1) -> None:
    Metrics.counter(NAMESPACE, name).inc(n)


def rejected(entry: dict) -> beam.pvalue.TaggedOutput:
    """A rejection as the `rejected` output, counted by reason."""
    count(f"rejected_{entry['reason']}")
    return beam.pvalue.TaggedOutput("rejected", entry)


def collected(pcoll, label: str):
    """pcoll passed through a one-output step, for use as a side input. Beam 2.77's in-process runner now and
    then ran a step before the side input it reads was complete, when a multi-output step (or a Flatten of
    such outputs) made that side input; never when a one-output step made it."""
    return pcoll | label >> beam.Map(_same)


def _same(value):
    return value


class WithSingleton(beam.PTransform):
    """Each element of the input paired with the one element of `singleton` (none when it is empty), by a join
    on keys instead of a side input: the pairs exist only once both are complete, on every runner. (Beam
    2.77's in-process runner has run a step before a side input derived from its own input was complete.)
    The input is spread over `fanout` keys, so the pairs are made in parallel; a key's values are read twice
    (the singleton, then the pairs), never gathered in a list: a key holds 1/fanout of the whole input."""

    def __init__(self, singleton, fanout: int = SINGLETON_FANOUT):
        super().__init__()
        self.singleton, self.fanout = singleton, fanout

    def expand(self, pcoll):
        fanout = self.fanout
        keyed = pcoll | "Spread" >> beam.Map(lambda x: (random.randrange(fanout), (False, x)))
        copies = self.singleton | "Copies" >> beam.FlatMap(lambda one: ((k, (True, one)) for k in range(fanout)))
        return ((keyed, copies)
                | "Both" >> beam.Flatten()
                | "Join" >> beam.GroupByKey()
                | "Pairs" >> beam.FlatMap(singleton_pairs))


def singleton_pairs(grouped: tuple[Any, Iterable[tuple[bool, Any]]]) -> Iterator[tuple[Any, Any]]:
    """(x, one) for every element x of a key's values and every singleton value among them; the values (a
    grouping's re-iterable result) are walked once for the singleton and once more for the elements."""
    _, values = grouped
    for one in [v for is_one, v in values if is_one]:
        for is_one, x in values:
            if not is_one:
                yield x, one


class Joined(beam.PTransform):
    """A dict of PCollections as one element: {name: [every value of that PCollection]}, made once all of them
    are complete (a join on one key, where side inputs would do: see WithSingleton). For small PCollections."""

    def expand(self, pcolls: dict):
        keyed = {name: pcoll | f"Key{name.title().replace('_', '')}" >> beam.Map(lambda x: (None, x))
                 for name, pcoll in pcolls.items()}
        return (keyed
                | "Join" >> beam.CoGroupByKey()
                | "Lists" >> beam.MapTuple(lambda _, found: {name: list(values) for name, values in found.items()}))


def windowed(values: Iterable) -> Iterator:
    """Values emitted from finish_bundle need a window: the global one."""
    for value in values:
        if isinstance(value, beam.pvalue.TaggedOutput):
            yield beam.pvalue.TaggedOutput(value.tag, GlobalWindows.windowed_value(value.value))
        else:
            yield GlobalWindows.windowed_value(value)


class PooledDoFn(beam.DoFn):
    """A DoFn whose work for an element is one function call: made here with one worker, or in the local
    pool with several (so a local build uses every core). Subclasses say which call (`call`), what its
    value gives (`done`), what a crash of its worker process gives (`crashed`, default: fail) and what an
    error it raised gives (`failed`, default: raise it here)."""

    MAX_QUEUED_PER_WORKER = 4  # calls waiting per worker before process() waits for some to finish
    _owners: dict[int, PooledDoFn] = {}  # ticket -> the DoFn that submitted it (steps fused in one stage)

    def __init__(self, workers: int):
        self.workers = workers

    def call(self, element, *side) -> tuple[Callable, tuple, dict, Any]:
        """(function, args, kwargs, context) of the element's work; context comes back to done/crashed."""
        raise NotImplementedError

    def done(self, context, value) -> Iterable:
        raise NotImplementedError

    def crashed(self, context, why: str, killed: bool) -> Iterable:
        raise RuntimeError(f"local pool: {why}")

    def failed(self, context, error: BaseException) -> Iterable:
        raise error

    def start_bundle(self):
        self._contexts: dict[int, Any] = {}
        self._stash: list[tuple[int, Outcome]] = []  # outcomes of this DoFn's calls met by another

    def process(self, element, *side):
        fn, args, kwargs, context = self.call(element, *side)
        yield from self.run(fn, args, kwargs, context)

    def run(self, fn: Callable, args: tuple, kwargs: dict, context, alone: bool = False) -> Iterator:
        """Run fn here, or submit it to the pool (`alone`: with nothing else in flight) and yield what has
        finished meanwhile."""
        if self.workers <= 1:
            yield from self.done(context, fn(*args, **kwargs))
            return
        pool = LocalPool.shared(self.workers)
        ticket = (pool.submit_alone if alone else pool.submit)(fn, *args, **kwargs)
        self._contexts[ticket] = context
        PooledDoFn._owners[ticket] = self
        yield from self._stashed()
        for ticket, outcome in pool.results(block=pool.in_flight > self.MAX_QUEUED_PER_WORKER * self.workers):
            yield from self._outcome(ticket, outcome)

    def _stashed(self) -> Iterator:
        while self._stash:
            yield from self._outcome(*self._stash.pop(0))

    def finish_bundle(self):
        if self.workers > 1 and self._contexts:
            pool = LocalPool.shared(self.workers)
            out = list(self._stashed())
            while self._contexts:
                for ticket, outcome in pool.results(block=True):
                    out.extend(self._outcome(ticket, outcome))
                out.extend(self._stashed())
            yield from windowed(out)

    def _outcome(self, ticket: int, outcome: Outcome) -> Iterator:
        owner = PooledDoFn._owners.pop(ticket, self)
        if owner is not self:
            owner._stash.append((ticket, outcome))
            return
        context = self._contexts.pop(ticket, None)
        if isinstance(outcome, Done):
            yield from self.done(context, outcome.value)
        elif isinstance(outcome, Raised):
            yield from self.failed(context, outcome.error)
        elif isinstance(outcome, Crashed):
            yield from self.crashed(context, outcome.why, outcome.killed)
