"""`tpu-shards inspect --report DIR`: see a dataset. Contact sheets of sampled records, charts, one HTML page.

Records are read with the project's own TFRecord reader (no TensorFlow). Everything shown comes from the
manifest and the records, so every text is treated as hostile: drawn through `stored.printable`, never parsed
as math by matplotlib, and HTML-escaped on a page whose Content-Security-Policy allows no script at all.
Needs the `report` extra (matplotlib); charts are drawn on Agg canvases, never through pyplot's global state.
"""
from __future__ import annotations

import hashlib
import html
import io
import json
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from PIL import Image, ImageDraw, ImageFont

from shard_utils import storage
from shard_utils.extras import require
from shard_utils.format.manifest import Manifest, load
from shard_utils.read.stored import StoredRecord, iter_shard, label_texts, printable

PER_CLASS = 8  # tiles per class on a contact sheet
MAX_CLASSES = 24  # classes on a contact sheet; more are chosen by seed
MAX_RECORDS = 5000  # records read per split for the sheet and the size chart
FIRST_REJECTED = 50  # rejected files listed on the page
TILE = 128  # pixels of a tile's image area
MANY_CLASSES = 40  # above this the class chart sorts counts instead of naming every class
CSP = "default-src 'none'; img-src 'self' data: file:; style-src 'unsafe-inline'"


@dataclass(frozen=True)
class Tile:
    """One sampled record as the contact sheet shows it."""

    split: str
    shard: str
    index: int
    source_id: str
    labels: tuple[str, ...]
    jpeg: bytes  # the image, or a clip's first frame
    frames: int  # frames in a clip; 0 for an image


@dataclass
class SplitSample:
    """What was read of one split: tiles per shown class (in seeded order), sizes of every record read,
    and shards that could not be read."""

    split: str
    seed: int
    groups: dict[str, list[Tile]]
    class_counts: dict[str, int]  # records per label (a multi-label record counts under each of its labels)
    num_records: int = 0
    scanned: int = 0
    shards_read: int = 0
    shards_total: int = 0
    sizes: list[tuple[int, int]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _hash(seed: int, *parts: object) -> int:
    text = "\0".join([str(seed), *map(str, parts)]).encode("utf-8", "replace")
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big")


def shown_classes(counts: dict[str, int], labels: Sequence[str], seed: int, limit: int = MAX_CLASSES) -> list[str]:
    """The classes a sheet shows: all present ones in label order, or `limit` of them chosen by seed."""
    present = [x for x in labels if counts.get(x, 0) > 0] + sorted(
        x for x, n in counts.items() if n > 0 and x not in set(labels))
    if len(present) <= limit:
        return present
    chosen = set(sorted(present, key=lambda x: _hash(seed, "class", x))[:limit])
    return [x for x in present if x in chosen]


def sample_split(m: Manifest, split: str, *, seed: int = 0, per_class: int = PER_CLASS,
                 max_classes: int = MAX_CLASSES, max_records: int = MAX_RECORDS) -> SplitSample:
    """Read up to max_records records of a split (shards in seeded order) and keep, per shown class, the
    per_class records whose seeded hash of the source id is smallest: the same seed gives the same sample."""
    info = m.split(split)
    classes = shown_classes(info.class_counts, m.labels, seed, max_classes)
    buckets: dict[str, list] = {c: [] for c in classes}
    sample = SplitSample(split, seed, {}, dict(info.class_counts), info.num_records, shards_total=len(info.shards))
    for shard in sorted(info.shards, key=lambda s: _hash(seed, "shard", s.path)):
        if sample.scanned >= max_records:
            break
        sample.shards_read += 1
        try:
            for record in iter_shard(m, split, shard):
                _take(m, record, buckets, per_class, seed, sample)
                if sample.scanned >= max_records:
                    break
        except storage.StorageError as exc:  # a damaged or vanished shard: said on the sheet and the page
            sample.problems.append(str(exc))
    sample.groups = {c: [t for _, t in sorted(buckets[c], key=lambda e: e[0])[:per_class]] for c in classes}
    return sample


def _take(m: Manifest, record: StoredRecord, buckets: dict[str, list], per_class: int, seed: int,
          sample: SplitSample) -> None:
    sample.scanned += 1
    if record.width and record.height:
        sample.sizes.append((record.width, record.height))
    labels = tuple(label_texts(m, record))
    bucket = buckets.get(labels[0] if labels else "")
    if bucket is None:
        return
    rank = (_hash(seed, record.source_id), record.shard, record.index)  # ties (hostile duplicates): by place
    media = record.media
    bucket.append((rank, Tile(record.split, record.shard, record.index, record.source_id, labels,
                              media[0] if media else b"", len(media) if record.is_video else 0)))
    if len(bucket) >= 4 * per_class:  # keep memory at a few tiles per class, whatever the split's size
        bucket.sort(key=lambda e: e[0])
        del bucket[per_class:]


# ---------------------------------------------------------------- contact sheet (Pillow)

HEADER_W = 190
CAPTION_LINES = 2
LINE_H = 15
PAD = 6
MARGIN = 12
TITLE_H = 44
BACKGROUND = (255, 255, 255)
TILE_BG = (232, 232, 232)
INK = (20, 20, 20)
MUTED = (110, 110, 110)
ALERT = (190, 30, 30)


def _font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    """DejaVu Sans as matplotlib ships it (wide Unicode coverage), else Pillow's built-in font."""
    try:
        from matplotlib import font_manager

        return ImageFont.truetype(font_manager.findfont("DejaVu Sans"), size)
    except Exception:  # matplotlib missing or its font unreadable: plain but legible
        return ImageFont.load_default(size)


def _fit_text(draw: ImageDraw.ImageDraw, text: str, font, width: int, keep_end: bool = False) -> str:
    """printable(text), cut with an ellipsis to fit width pixels: its end is dropped, or with keep_end its
    start (a source id's file name is at its end)."""
    text = printable(text)
    if draw.textlength(text, font=font) <= width:
        return text

    def cut(n: int) -> str:
        return "\u2026" + text[len(text) - n:] if keep_end else text[:n] + "\u2026"

    lo, hi = 0, len(text)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if draw.textlength(cut(mid), font=font) <= width:
            lo = mid
        else:
            hi = mid - 1
    return cut(lo)


def _wrap(draw: ImageDraw.ImageDraw, text: str, font, width: int, lines: int) -> list[str]:
    """printable(text) broken into at most `lines` lines of width pixels, the last one cut with an ellipsis."""
    text, out = printable(text), []
    while text and len(out) < lines - 1:
        cut = len(_fit_text(draw, text, font, width).rstrip("\u2026"))
        if cut >= len(text):
            break
        space = text.rfind(" ", 0, cut + 1)
        cut = space + 1 if space > 0 else max(cut, 1)
        out.append(text[:cut].rstrip())
        text = text[cut:]
    if text:
        out.append(_fit_text(draw, text, font, width))
    return out


def thumbnail(jpeg: bytes, size: int = TILE) -> Image.Image | None:
    """The stored image scaled to fit size x size, or None if it does not decode. Large images are decoded at
    reduced scale; small ones (CIFAR-like 32x32) are enlarged by a whole factor, pixels kept square and sharp."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(io.BytesIO(jpeg)) as image:
                image.draft("RGB", (size, size))
                image = image.convert("RGB")
        factor = size // max(image.width, image.height)
        if factor >= 2:
            return image.resize((image.width * factor, image.height * factor), Image.Resampling.NEAREST)
        image.thumbnail((size, size))
        return image
    except Exception:  # a hostile or damaged record: the tile says so
        return None


@dataclass(frozen=True)
class Placed:
    """Where a tile's image was pasted on the sheet (left, top, right, bottom)."""

    tile: Tile
    box: tuple[int, int, int, int]


def render_sheet(sample: SplitSample, tile: int = TILE) -> tuple[Image.Image, list[Placed]]:
    """The contact sheet of a split: one row per shown class, its sampled records left to right, each with
    its label text and source id under it. Returns the image and where each record's image went."""
    per_row = max([len(v) for v in sample.groups.values()] + [1])
    cell_w, cell_h = tile + 2 * PAD, tile + PAD * 2 + CAPTION_LINES * LINE_H + PAD
    rows = max(len(sample.groups), 1)
    width = max(2 * MARGIN + HEADER_W + per_row * cell_w, 720)  # room for the subtitle with few tiles
    height = MARGIN + TITLE_H + rows * cell_h + MARGIN + LINE_H * (1 + min(len(sample.problems), 3))
    sheet = Image.new("RGB", (width, height), BACKGROUND)
    draw = ImageDraw.Draw(sheet)
    title_font, font, small = _font(17), _font(12), _font(11)
    shown = sum(len(v) for v in sample.groups.values())
    draw.text((MARGIN, MARGIN), _fit_text(draw, f"split {sample.split}", title_font, width - 2 * MARGIN),
              fill=INK, font=title_font)
    draw.text((MARGIN, MARGIN + 22), _fit_text(
        draw, f"{shown} tiles of {sample.num_records} records, {len(sample.groups)} of {len(sample.class_counts)} "
              f"classes shown, "
              f"sampled by seed {sample.seed} from {sample.scanned} records read "
              f"({sample.shards_read} of {sample.shards_total} shards)", small, width - 2 * MARGIN),
              fill=MUTED, font=small)
    placed: list[Placed] = []
    top = MARGIN + TITLE_H
    for name, tiles in sample.groups.items():
        draw.line((MARGIN, top, width - MARGIN, top), fill=TILE_BG)
        lines = _wrap(draw, name, font, HEADER_W - PAD * 2, 3)
        for i, line in enumerate(lines):
            draw.text((MARGIN, top + PAD + i * LINE_H), line, fill=INK, font=font)
        draw.text((MARGIN, top + PAD + len(lines) * LINE_H + 2),
                  f"{sample.class_counts.get(name, 0)} in split", fill=MUTED, font=small)
        for col, item in enumerate(tiles):
            placed.append(_draw_tile(sheet, draw, item, MARGIN + HEADER_W + col * cell_w + PAD, top + PAD, tile,
                                     small))
        top += cell_h
    if not sample.groups:
        draw.text((MARGIN + HEADER_W, top + PAD), "no records to show", fill=MUTED, font=font)
        top += cell_h
    for problem in sample.problems[:3]:
        draw.text((MARGIN, top), _fit_text(draw, problem, small, width - 2 * MARGIN), fill=ALERT, font=small)
        top += LINE_H
    return sheet, placed


def _draw_tile(sheet: Image.Image, draw: ImageDraw.ImageDraw, item: Tile, left: int, top: int, size: int,
               font) -> Placed:
    draw.rectangle((left, top, left + size - 1, top + size - 1), fill=TILE_BG)
    image = thumbnail(item.jpeg, size)
    if image is None:
        draw.line((left, top, left + size - 1, top + size - 1), fill=ALERT, width=2)
        draw.line((left, top + size - 1, left + size - 1, top), fill=ALERT, width=2)
        draw.text((left + 4, top + size // 2 - 7), "does not decode", fill=ALERT, font=font)
        box = (left, top, left, top)
    else:
        x, y = left + (size - image.width) // 2, top + (size - image.height) // 2
        sheet.paste(image, (x, y))
        box = (x, y, x + image.width, y + image.height)
    if item.frames:
        badge = f"\u25b6 {item.frames} frames"
        w = int(draw.textlength(badge, font=font)) + 6
        draw.rectangle((left, top, left + w, top + LINE_H), fill=(0, 0, 0))
        draw.text((left + 3, top + 1), badge, fill=(255, 255, 255), font=font)
    caption_top = top + size + 3
    draw.text((left, caption_top), _fit_text(draw, ", ".join(item.labels) or "(no label)", font, size),
              fill=INK, font=font)
    draw.text((left, caption_top + LINE_H), _fit_text(draw, item.source_id, font, size, keep_end=True), fill=MUTED,
              font=font)
    return Placed(item, box)


# ---------------------------------------------------------------- charts (matplotlib, Agg)

def _figure(width: float, height: float):
    require("matplotlib", needed_for="the dataset report")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _label(text: str, limit: int = 28) -> str:
    return printable(str(text), limit)


def _plain_text():
    """Mathtext and TeX off, whatever the user's matplotlibrc says: a label like `$\\x$` from a record is
    drawn as it is, never parsed. Charts are made and saved inside it (tick labels are made when drawn)."""
    matplotlib = require("matplotlib", needed_for="the dataset report")
    return matplotlib.rc_context({"text.parse_math": False, "text.usetex": False})


def _safe_text(fn):
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with _plain_text():
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
            bottom = [b + h for b, h in zip(bottom, heights)]
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


def _reasons(part: Any) -> dict[str, int]:
    by_reason = part.get("by_reason", {}) if isinstance(part, dict) else {}
    if not isinstance(by_reason, dict):
        return {}
    return {str(k): v for k, v in by_reason.items() if isinstance(v, int) and not isinstance(v, bool) and v > 0}


@_safe_text
def rejected_chart(m: Manifest):
    """Rejected (and skipped) files by reason, from the manifest; None when nothing was rejected or skipped."""
    parts = [(title, _reasons(part)) for title, part in (("rejected", m.rejected), ("skipped", m.skipped))]
    parts = [(t, r) for t, r in parts if r]
    if not parts:
        return None
    rows = max(len(r) for _, r in parts)
    fig = _figure(5 * len(parts) + 1, 1.2 + 0.32 * rows)
    axes = fig.subplots(1, len(parts), squeeze=False)[0]
    for ax, (title, reasons) in zip(axes, parts):
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
    with _plain_text():
        fig.savefig(buffer, format="png")
    buffer.seek(0)
    return Image.open(buffer).convert("RGB")


def contact_sheet(dataset: str | Manifest, split: str = "train", *, seed: int = 0, per_class: int = PER_CLASS,
                  max_classes: int = MAX_CLASSES, max_records: int = MAX_RECORDS) -> Image.Image:
    """A split's contact sheet as a Pillow image (e.g. the last line of a notebook cell)."""
    m = dataset if isinstance(dataset, Manifest) else load(dataset)
    sample = sample_split(m, split, seed=seed, per_class=per_class, max_classes=max_classes, max_records=max_records)
    return render_sheet(sample)[0]


# ---------------------------------------------------------------- rejected.jsonl

@dataclass(frozen=True)
class RejectedRows:
    """The first rejected files (source, reason, message), how many lines the file has, and any read problem."""

    rows: list[tuple[str, str, str]]
    total: int
    problem: str | None = None


def first_rejected(m: Manifest, limit: int = FIRST_REJECTED) -> RejectedRows:
    """The first `limit` entries of the dataset's rejected.jsonl (its path is checked when the manifest loads)."""
    name = m.rejected.get("path")
    if not m.rejected.get("count") or not isinstance(name, str):
        return RejectedRows([], 0)
    path = storage.join(m.location, name)
    try:
        lines = [line for line in storage.read_bytes(path).decode("utf-8", "replace").splitlines() if line.strip()]
    except storage.StorageError as exc:
        return RejectedRows([], 0, str(exc))
    rows = []
    for number, line in enumerate(lines[:limit], start=1):
        try:
            entry = json.loads(line)
        except ValueError:
            entry = None
        if isinstance(entry, dict):
            rows.append(tuple(str(entry.get(k, "")) for k in ("source", "reason", "message")))
        else:
            rows.append((f"line {number}", "(not a JSON object)", line[:300]))
    return RejectedRows(rows, len(lines))


# ---------------------------------------------------------------- the page

def _e(value: Any) -> str:
    """Any value as escaped HTML text, control characters shown as escapes."""
    return html.escape(printable(str(value)), quote=True)


def _table(rows: Iterable[Sequence[Any]], header: Sequence[str] | None = None, cls: str = "") -> str:
    head = "<tr>" + "".join(f"<th>{_e(h)}</th>" for h in header) + "</tr>" if header else ""
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}">{head}{body}</table>'


def _summary_rows(m: Manifest) -> list[tuple[str, Any]]:
    def reasons(part: dict) -> str:
        found = _reasons(part)
        return f"{part.get('count', 0)}" + (f" ({', '.join(f'{k} {v}' for k, v in found.items())})" if found else "")

    return [
        ("dataset", m.location), ("input", m.input), ("created", m.created), ("tool version", m.tool_version),
        ("media", m.media), ("labels", f"{len(m.labels)}: " + ", ".join(printable(x, 40) for x in m.labels[:30])
                             + (" ..." if len(m.labels) > 30 else "")),
        ("image size", "x".join(map(str, m.image_size)) if m.image_size else "varies"),
        ("TPU layout", f"{m.num_cores} cores x {m.num_hosts} hosts"),
        ("files seen", m.files_seen), ("rejected", reasons(m.rejected)), ("skipped", reasons(m.skipped)),
    ]


def _split_rows(m: Manifest) -> list[tuple]:
    rows = []
    for name, s in m.splits.items():
        sizes = [x.num_records for x in s.shards]
        spread = str(min(sizes)) if min(sizes) == max(sizes) else f"{min(sizes)} or {max(sizes)}" if max(
            sizes) - min(sizes) == 1 else f"{min(sizes)} to {max(sizes)}"
        rows.append((name, s.num_records, len(s.shards), spread,
                     f"{s.num_bytes / 1e6:.1f}", sum(1 for v in s.class_counts.values() if v > 0)))
    return rows


STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1400px;padding:0 16px;
color:#1a1a1a}
h1{font-size:22px;margin-bottom:4px}h2{font-size:17px;margin-top:32px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;
vertical-align:top;word-break:break-word;max-width:640px}th{background:#f4f4f4}
img{max-width:100%;height:auto;border:1px solid #eee;margin:6px 0}.muted{color:#666}.problem{color:#b01e1e}
td.num,th.num{text-align:right}
"""


def render_page(m: Manifest, samples: Sequence[SplitSample], charts: dict[str, str], sheets: list[str],
                rejected: RejectedRows) -> str:
    """index.html: every value escaped; images referenced by the file names given (beside the page)."""
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        f"<title>tpu-shards report: {_e(m.location)}</title><style>{STYLE}</style></head><body>",
        f"<h1>tpu-shards dataset report</h1><p class=\"muted\">{_e(m.location)}</p>",
        "<h2>Summary</h2>", _table(_summary_rows(m)),
        _table(_split_rows(m), ["split", "records", "shards", "records per shard", "MB", "classes"]),
        "<h2>Records per class</h2>", _img(charts.get("classes"), "records per class per split"),
        "<h2>Shards</h2>",
        f"<p class=\"muted\">Target shard size: {_e(m.options.get('target_shard_mb', 'not recorded'))} MB; "
        "within a split, record counts differ by at most one.</p>",
        _img(charts.get("shards"), "records and MB per shard"),
        "<h2>Image sizes</h2>", _img(charts.get("sizes"), "image width and height distribution"),
        "<h2>Contact sheets</h2>",
        "<p class=\"muted\">Records sampled by seed, grouped by class; under each image its label text and "
        "source id.</p>",
    ]
    for sample, sheet in zip(samples, sheets):
        parts.append(f"<h3>{_e(sample.split)}</h3>" + _img(sheet, f"contact sheet of split {sample.split}"))
        parts.extend(f'<p class="problem">{_e(p)}</p>' for p in sample.problems)
    parts.append("<h2>Rejected files</h2>")
    if charts.get("rejected"):
        parts.append(_img(charts["rejected"], "rejected and skipped files by reason"))
    if rejected.problem:
        parts.append(f'<p class="problem">{_e(rejected.problem)}</p>')
    if rejected.rows:
        more = f" (first {len(rejected.rows)} of {rejected.total})" if rejected.total > len(rejected.rows) else ""
        parts.append(f"<p>Listed in {_e(m.rejected.get('path', ''))}{_e(more)}:</p>")
        parts.append(_table(rejected.rows, ["source", "reason", "message"]))
    elif not rejected.problem:
        parts.append("<p>No file was rejected.</p>")
    parts.append("<h2>Build options</h2>")
    parts.append(_table(sorted((k, json.dumps(v, ensure_ascii=False)) for k, v in m.options.items())))
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _img(name: str | None, alt: str) -> str:
    if not name:
        return '<p class="muted">(no chart: nothing to show)</p>'
    return f'<img src="{html.escape(name, quote=True)}" alt="{_e(alt)}">'


def write_report(dataset: str | Manifest, out_dir: str, *, seed: int = 0, per_class: int = PER_CLASS,
                 max_classes: int = MAX_CLASSES, max_records: int = MAX_RECORDS) -> str:
    """Write index.html, the charts and a contact sheet per split into a local folder; returns the page's path."""
    require("matplotlib", needed_for="the dataset report")
    if storage.is_gcs(out_dir):
        raise storage.StorageError(f"the report is written to a local folder, not {out_dir}")
    m = dataset if isinstance(dataset, Manifest) else load(dataset)
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as exc:
        raise storage.StorageError(f"cannot create report folder {out_dir}: {exc.strerror or exc}") from None
    samples = [sample_split(m, name, seed=seed, per_class=per_class, max_classes=max_classes,
                            max_records=max_records) for name in m.splits]
    charts: dict[str, str] = {}
    with warnings.catch_warnings(), _plain_text():
        warnings.simplefilter("ignore")  # glyphs missing from DejaVu Sans: shown as boxes, nothing to act on
        figures = {"classes": class_chart(m), "shards": shard_chart(m), "sizes": size_chart(samples),
                   "rejected": rejected_chart(m)}
        for name, fig in figures.items():
            if fig is not None:
                charts[name] = f"{name}.png"
                fig.savefig(os.path.join(out_dir, charts[name]))
    sheets = []
    for i, sample in enumerate(samples):  # numbered, never named after a split: names are data
        sheets.append(f"contact-{i:02d}.png")
        render_sheet(sample)[0].save(os.path.join(out_dir, sheets[-1]), optimize=True)
    page = render_page(m, samples, charts, sheets, first_rejected(m))
    path = os.path.join(out_dir, "index.html")
    storage.write_bytes(path, page.encode("utf-8"))
    return path
