"""Measurements (best of repeats) and the small formatting helpers of the report."""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class Timing:
    """One measurement: wall and CPU seconds (the best of the repeats) and memory (the largest seen)."""

    seconds: float
    cpu: float = math.nan  # user + system seconds of every process involved
    peak_mb: float = math.nan  # the largest summed RSS of the process tree
    driver_mb: float = math.nan  # the job's driver process alone (VmHWM)
    driver_cpu: float = math.nan  # user + system seconds of the job's driver process alone


class Board:
    """Measurements by key; repeats keep the smallest times and the largest memory."""

    def __init__(self) -> None:
        self.entries: dict[tuple, Timing] = {}

    def add(self, key: tuple, new: Timing) -> None:
        old = self.entries.get(key)
        if old is None:
            self.entries[key] = new
            return
        self.entries[key] = Timing(_best(min, old.seconds, new.seconds), _best(min, old.cpu, new.cpu),
                                   _best(max, old.peak_mb, new.peak_mb), _best(max, old.driver_mb, new.driver_mb),
                                   _best(min, old.driver_cpu, new.driver_cpu))

    def add_result(self, key: tuple, result: dict) -> None:
        """A child's result dict (job_child / tfds_child JSON plus runner's peak_tree_mb)."""
        self.add(key, timing_of(result))

    def get(self, key: tuple) -> Timing:
        return self.entries.get(key) or Timing(math.nan)


def timing_of(result: dict) -> Timing:
    """The Timing of a child's result dict (job_child / tfds_child JSON plus runner's peak_tree_mb)."""
    return Timing(result["seconds"], result.get("cpu_seconds", math.nan), result.get("peak_tree_mb", math.nan),
                  result.get("driver_peak_mb", math.nan), result.get("driver_cpu_seconds", math.nan))


def _best(pick, a: float, b: float) -> float:
    values = [v for v in (a, b) if not math.isnan(v)]
    return pick(values) if values else math.nan


def per_image(n: int, tiny: int, value: float, tiny_value: float) -> float:
    """Seconds per image without the fixed start-up: (v(n) - v(tiny)) / (n - tiny); NaN if not positive."""
    diff = value - tiny_value
    return diff / (n - tiny) if diff > 0 else math.nan


def ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(b) else math.nan


def verdict(value: float, target: float, at_most: bool = False) -> str:
    if math.isnan(value):
        return "n/a"
    ok = value <= target if at_most else value >= target
    return f"{'MET' if ok else 'MISSED'} (target {'<=' if at_most else '>='} {target:g})"


def fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def table(headers: list[str], rows: list[list], indent: str = "  ") -> str:
    """Columns aligned: the first to the left, the others to the right."""
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    lines = []
    for row in [headers, *rows]:
        cells = [str(c).ljust(w) if i == 0 else str(c).rjust(w)
                 for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        lines.append(indent + "  ".join(cells).rstrip())
    return "\n".join(lines)
