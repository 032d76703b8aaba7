"""The report's charts (matplotlib, drawn on Agg canvases, never through pyplot's global state): records per
class, records and bytes per shard, stored image sizes, rejected files by reason. Texts from the dataset are
never parsed as math."""
from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

from PIL import Image

from shard_utils.extras import require
from shard_utils.format.manifest import Manifest, load
from shard_utils.read.report.rejects import reason_counts
from shard_utils.read.report.sample import SplitSample
from shard_utils.text import printable

__all__ = ["MANY_CLASSES", "plain_text", "class_chart", "shard_chart", "size_chart", "rejected_chart", "as_image"]

MANY_CLASSES = 40  # above this the class chart sorts counts instead of naming every class


def _figure(width: float, height: float):
    require("matplotlib", needed_for="the dataset report")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _label(text: str, limit: int = 28) -> str:
    return printable(str(text), limit)


def plain_text():
    """Mathtext and TeX off, whatever the user's matplotlibrc says: a label like `$\\x$` from a record is
    drawn as it is, never parsed. Charts are made and saved inside it (tick labels are made when drawn)."""
    matplotlib = require("matplotlib", needed_for="the dataset report")
    return matplotlib.rc_context({"text.parse_math": False, "text.usetex": False})


def _safe_text(fn):
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with plain_text():
            return fn(*args, **kwargs)

    return wrapper


def _split_colors(names: Sequence[str]) -> dict[str, Any]:
    palette = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C"]
    return {n: palette[i % len(palette)] for i, n in enumerate(names)}


@_safe_text
def class_chart(dataset: str | Manifest):
    """Records per class per split (bars) from the manifest's class counts; a matplotlib Figure."""
    m = dataset if isinstance(dataset, Manifest) else load(dataset)
    splits = list(m.splits)
    classes = list(m.labels) + sorted({c for s in m.splits.values() for c in s.class_counts} - set(m.labels))
    colors = _split_colors(splits)
    if len(classes) <= MANY_CLASSES:
        fig = _figure(max(6.0, 1.2 + 0.32 * len(classes) * max(len(splits), 2) / 2), 4.2)
        ax = fig.add_subplot()
        width = 0.8 / max(len(splits), 1)
        for i, name in enumerate(splits):
            counts = [m.splits[name].class_counts.get(c, 0) for c in classes]
            xs = [k + (i - (len(splits) - 1) / 2) * width for k in range(len(classes))]
            bars = ax.bar(xs, counts, width, color=colors[name], label=_label(name))
            if len(classes) * len(splits) <= 60:
                ax.bar_label(bars, fontsize=7, padding=1)
        ax.set_xticks(range(len(classes)), [_label(c) for c in classes],
                      rotation=45 if len(classes) > 6 else 0, ha="right" if len(classes) > 6 else "center")
        ax.set_xlabel("class")
    else:
        fig = _figure(9, 4.2)
        ax = fig.add_subplot()
        notes = []
        for name in splits:
            ranked = sorted(classes, key=lambda c: (-m.splits[name].class_counts.get(c, 0), c))
            counts = [m.splits[name].class_counts.get(c, 0) for c in ranked]
            ax.plot(range(1, len(counts) + 1), counts, color=colors[name], label=_label(name), drawstyle="steps-mid")
            notes.append(f"{_label(name, 16)}: most {_label(ranked[0])} ({counts[0]}), "
                         f"fewest {_label(ranked[-1])} ({counts[-1]})")
        ax.text(0.99, 0.97, "\n".join(notes), transform=ax.transAxes, ha="right", va="top", fontsize=8)
        ax.set_xlabel(f"{len(classes)} classes (too many to name), each split sorted by count")
        ax.set_ylim(0, max([1] + [max(s.class_counts.values(), default=0) for s in m.splits.values()]) * 1.3)
    ax.set_ylabel("records")
    ax.set_title("Records per class")
    ax.grid(axis="y", alpha=0.3)
    fig.legend(*ax.get_legend_handles_labels(), title="split", fontsize=8, loc="outside right upper")
    return fig


def _integer_axis(axis) -> None:
    """Ticks at whole numbers only (shard indices, record and file counts)."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


@_safe_text
def shard_chart(m: Manifest):
    """Per split: records per shard (differing by at most one) and MB per shard against the target size."""
    splits = list(m.splits)
    fig = _figure(10, 2.6 * len(splits) + 0.4)
    axes = fig.subplots(len(splits), 2, squeeze=False)
    target = m.options.get("target_shard_mb")
    target = target if isinstance(target, (int, float)) and not isinstance(target, bool) and target > 0 else None
    colors = _split_colors(splits)
    for row, name in enumerate(splits):
        shards = m.splits[name].shards
        xs = list(range(len(shards)))
        counts = [s.num_records for s in shards]
        low, high = min(counts), max(counts)
        ax = axes[row][0]
        ax.plot(xs, counts, "o", color=colors[name], markersize=max(1.5, 5 - len(shards) / 100))
        ax.set_ylim(low - 1.5, high + 1.5)  # zoomed on purpose: the point is that counts differ by at most one
        _integer_axis(ax.xaxis)
        _integer_axis(ax.yaxis)
        spread = f"all {low}" if low == high else f"{low} or {high}" if high - low == 1 else f"{low} to {high}"
        ax.set_title(f"{_label(name)}: records per shard ({spread})", fontsize=10)
        ax.set_xlabel("shard")
        ax.grid(alpha=0.3)
        ax = axes[row][1]
        sizes = [s.num_bytes / 1e6 for s in shards]
        ax.bar(xs, sizes, color=colors[name], width=0.8 if len(shards) < 64 else 1.0)
        _integer_axis(ax.xaxis)
        top = max(sizes) * 1.25
        if target is not None and target <= max(sizes) * 2:
            ax.axhline(target, color="#C44E52", linestyle="--", linewidth=1)
            ax.text(1.0, target, f"target {target:g} MB ", transform=ax.get_yaxis_transform(), va="bottom",
                    ha="right", fontsize=8, color="#C44E52")
            top = max(top, target * 1.15)
        elif target is not None:  # a small split: a line at 128 MB would flatten every bar to nothing
            ax.text(0.99, 0.97, f"target {target:g} MB: far above these shards (the split is small)",
                    transform=ax.transAxes, va="top", ha="right", fontsize=8, color="#C44E52")
        ax.set_ylim(0, top)
        ax.set_title(f"{_label(name)}: MB per shard ({len(shards)} shards, {m.splits[name].num_bytes / 1e6:.1f} MB)",
                     fontsize=10)
        ax.set_xlabel("shard")
        ax.set_ylabel("MB")
        ax.grid(axis="y", alpha=0.3)
    return fig


def _counts_or_hist(ax, samples: Sequence[SplitSample], which: int, colors: dict[str, Any]) -> tuple[int, int]:
    """Records per value when a dimension takes few values (bars at exact pixels), else a stacked histogram."""
    per_split = [(s.split, [v[which] for v in s.sizes]) for s in samples if s.sizes]
    values = sorted({v for _, vs in per_split for v in vs})
    if len(values) <= 12:
        positions = {v: i for i, v in enumerate(values)}
        bottom = [0] * len(values)
        for name, vs in per_split:
            heights = [0] * len(values)
            for v in vs:
                heights[positions[v]] += 1
            ax.bar(range(len(values)), heights, bottom=bottom, color=colors[name], label=_label(name), width=0.7)
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
        ax.set_xticks(range(len(values)), [str(v) for v in values], rotation=45 if len(values) > 6 else 0)
    else:
        edges = _bin_edges(values[0], values[-1])
        ax.hist([vs for _, vs in per_split], bins=edges, stacked=True, color=[colors[n] for n, _ in per_split],
                label=[_label(n) for n, _ in per_split])
    _integer_axis(ax.yaxis)
    return values[0], values[-1]


def _bin_edges(low: int, high: int, bins: int = 30) -> list[float]:
    """Histogram edges on whole pixels, about `bins` of them."""
    step = max(1, -(-(high - low + 1) // bins))
    return [low - 0.5 + i * step for i in range((high - low) // step + 2)]


@_safe_text
def size_chart(samples: Sequence[SplitSample]):
    """Stored image sizes of the records read, per split: width against height, and each on its own."""
    fig = _figure(12, 3.8)
    axes = fig.subplots(1, 3)
    colors = _split_colors([s.split for s in samples])
    read = sum(s.scanned for s in samples)
    if not any(s.sizes for s in samples):
        for ax in axes:
            ax.text(0.5, 0.5, "no records read", ha="center", va="center", transform=ax.transAxes)
        return fig
    ax = axes[0]
    for s in samples:
        if s.sizes:
            ax.scatter([v[0] for v in s.sizes], [v[1] for v in s.sizes], s=12, alpha=0.5, color=colors[s.split],
                       label=_label(s.split), edgecolors="none")
    ax.set_xlabel("width (px)")
    ax.set_ylabel("height (px)")
    ax.set_title("width x height", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(title="split", fontsize=8)
    for ax, which, axis_name in ((axes[1], 0, "width"), (axes[2], 1, "height")):
        low, high = _counts_or_hist(ax, samples, which, colors)
        ax.set_title(f"{axis_name}: " + (f"all {low} px" if low == high else f"{low} to {high} px"), fontsize=10)
        ax.set_xlabel(f"{axis_name} (px)")
        ax.set_ylabel("records")
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"Image sizes of the {read} records read", fontsize=11)
    return fig


@_safe_text
def rejected_chart(m: Manifest):
    """Rejected (and skipped) files by reason, from the manifest; None when nothing was rejected or skipped."""
    parts = [(title, reason_counts(part)) for title, part in (("rejected", m.rejected), ("skipped", m.skipped))]
    parts = [(t, r) for t, r in parts if r]
    if not parts:
        return None
    rows = max(len(r) for _, r in parts)
    fig = _figure(5 * len(parts) + 1, 1.2 + 0.32 * rows)
    axes = fig.subplots(1, len(parts), squeeze=False)[0]
    for ax, (title, reasons) in zip(axes, parts, strict=True):
        items = sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))[::-1]
        bars = ax.barh(range(len(items)), [v for _, v in items], color="#C44E52" if title == "rejected" else "#8C8C8C")
        ax.set_yticks(range(len(items)), [_label(k) for k, _ in items])
        ax.bar_label(bars, fontsize=8, padding=2)
        ax.set_title(f"{title} files by reason ({sum(reasons.values())})", fontsize=10)
        ax.set_xlabel("files")
        ax.set_xlim(0, max(reasons.values()) * 1.2)
        _integer_axis(ax.xaxis)
    return fig


def as_image(fig) -> Image.Image:
    """A Figure as a Pillow image (displays inline in any notebook, whatever its matplotlib backend)."""
    buffer = io.BytesIO()
    with plain_text():
        fig.savefig(buffer, format="png")
    buffer.seek(0)
    return Image.open(buffer).convert("RGB")
