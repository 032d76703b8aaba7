"""The peers table: per mode, each tool's medians over the rounds and tpu-shards' ratios to each peer."""
from __future__ import annotations

import statistics
from collections.abc import Sequence

from peers_bench.measure import Run

MODE_NAMES = {"pass": "pass-through", "decode": "decode check", "reencode": "re-encode to 224"}
# (row label, the figure's function of (runs at count, runs at tiny, count, tiny), its format)
MEASURES = (
    ("wall s", lambda big, tiny, n, t: med(r.wall for r in big), "{:.2f}"),
    ("CPU s per 1,000 images, start-up included", lambda big, tiny, n, t: 1e3 * med(r.cpu for r in big) / n,
     "{:.2f}"),
    ("CPU ms per image, start-up subtracted", lambda big, tiny, n, t: steady_cpu_ms(big, tiny, n, t), "{:.2f}"),
    ("peak MB, all processes (PSS)", lambda big, tiny, n, t: med(r.peak_mb for r in big), "{:.0f}"),
    ("fixed cost: wall s", lambda big, tiny, n, t: med(r.wall for r in tiny), "{:.2f}"),
    ("fixed cost: CPU s", lambda big, tiny, n, t: med(r.cpu for r in tiny), "{:.2f}"),
)
RATIOS = (("wall, {} / peer", "wall s"),
          ("CPU per image (start-up subtracted), {} / peer", "CPU ms per image, start-up subtracted"))
OURS = ("tpu-shards", "no-checks")  # the default build, and the same without its quality checks (--checks-off)


def med(values) -> float:
    return statistics.median(list(values))


def steady_cpu_ms(big: Sequence[Run], tiny: Sequence[Run], n: int, t: int) -> float:
    """CPU milliseconds per image once the fixed cost (the median CPU of the tiny runs) is taken away."""
    return 1e3 * (med(r.cpu for r in big) - med(r.cpu for r in tiny)) / (n - t)


def figures(runs: dict[tuple[str, str, int], list[Run]], tools: Sequence[str], mode: str, n: int,
            t: int) -> dict[str, dict[str, float]]:
    """{row label: {tool: figure}} for one mode, each of our columns' ratios to each peer where both were measured."""
    rows: dict[str, dict[str, float]] = {label: {} for label, _, _ in MEASURES}
    for tool in tools:
        big, tiny = runs.get((tool, mode, n)), runs.get((tool, mode, t))
        if big and tiny:
            for label, figure, _ in MEASURES:
                rows[label][tool] = figure(big, tiny, n, t)
    for ours in (o for o in OURS if o in tools):
        for label, of in RATIOS:
            mine = rows[of].get(ours)
            rows[label.format(ours)] = {tool: mine / value for tool, value in rows[of].items()
                                        if tool not in OURS and mine is not None and value > 0}
    return rows


def table(runs: dict[tuple[str, str, int], list[Run]], tools: Sequence[str], modes: Sequence[str], n: int,
          t: int) -> str:
    """The table as text: a column per tool, a block of rows per mode."""
    formats = {label: fmt for label, _, fmt in MEASURES} | {label.format(o): "{:.2f}x" for label, _ in RATIOS
                                                            for o in OURS}
    width = max(len(label) for label in formats) + 18
    lines = [f"{'':<{width}}" + "".join(f"{tool:>12}" for tool in tools)]
    for mode in modes:
        for label, values in figures(runs, tools, mode, n, t).items():
            cells = "".join(f"{formats[label].format(values[tool]) if tool in values else '-':>12}" for tool in tools)
            lines.append(f"{MODE_NAMES[mode] + ': ' + label:<{width}}{cells}")
    return "\n".join(lines)
