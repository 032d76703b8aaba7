"""The run's accounting of its inputs: how many were seen, and those skipped without being read (seen = written +
rejected + skipped closes in the manifest); and the namespace of the job's Beam counters."""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["NAMESPACE", "Tally", "sum_tallies"]

NAMESPACE = "tpu_shards"  # the job's Beam counters (the progress line reads them)


@dataclass
class Tally:
    """Inputs seen, and those skipped without being read, by reason (and not-media ones by extension)."""

    seen: int = 0
    skipped: Counter = field(default_factory=Counter)
    extensions: Counter = field(default_factory=Counter)

    def skip(self, reason: str, extension: str) -> None:
        self.skipped[reason] += 1
        if reason == "not_media":
            self.extensions[extension or "(none)"] += 1


def sum_tallies(tallies: Iterable[Tally]) -> Tally:
    """The tallies of every part of the listing, as one."""
    total = Tally()
    for t in tallies:
        total.seen += t.seen
        total.skipped.update(t.skipped)
        total.extensions.update(t.extensions)
    return total
