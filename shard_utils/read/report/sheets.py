"""Contact sheets (Pillow): one row per shown class, its sampled records' images with their label text and
source id, every text drawn through `shard_utils.text.printable`."""
from __future__ import annotations

import io
import warnings
from dataclasses import dataclass

from PIL import Image, ImageDraw, ImageFont

from shard_utils.format.manifest import Manifest, load
from shard_utils.read.report.sample import MAX_CLASSES, MAX_RECORDS, PER_CLASS, SplitSample, Tile, sample_split
from shard_utils.text import printable

__all__ = ["TILE", "thumbnail", "Placed", "render_sheet", "contact_sheet"]

TILE = 128  # pixels of a tile's image area

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
    text = printable(text)
    out: list[str] = []
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
            with Image.open(io.BytesIO(jpeg)) as opened:
                opened.draft("RGB", (size, size))
                image = opened.convert("RGB")
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


def render_sheet(sample: SplitSample, tile: int = TILE, title: str | None = None, subtitle: str | None = None,
                 counted: str = "in split") -> tuple[Image.Image, list[Placed]]:
    """The contact sheet of a split: one row per shown class, its sampled records left to right, each with
    its label text and source id under it. Returns the image and where each record's image went. `title`,
    `subtitle` and `counted` (what a row's count is of) word a sheet of other groups (near-duplicates)."""
    per_row = max([len(v) for v in sample.groups.values()] + [1])
    cell_w, cell_h = tile + 2 * PAD, tile + PAD * 2 + CAPTION_LINES * LINE_H + PAD
    rows = max(len(sample.groups), 1)
    width = max(2 * MARGIN + HEADER_W + per_row * cell_w, 720)  # room for the subtitle with few tiles
    height = MARGIN + TITLE_H + rows * cell_h + MARGIN + LINE_H * (1 + min(len(sample.problems), 3))
    sheet = Image.new("RGB", (width, height), BACKGROUND)
    draw = ImageDraw.Draw(sheet)
    title_font, font, small = _font(17), _font(12), _font(11)
    shown = sum(len(v) for v in sample.groups.values())
    draw.text((MARGIN, MARGIN), _fit_text(draw, title or f"split {sample.split}", title_font, width - 2 * MARGIN),
              fill=INK, font=title_font)
    draw.text((MARGIN, MARGIN + 22), _fit_text(
        draw, subtitle or f"{shown} tiles of {sample.num_records} records, {len(sample.groups)} of "
                          f"{len(sample.class_counts)} classes shown, "
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
                  f"{sample.class_counts.get(name, 0)} {counted}", fill=MUTED, font=small)
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


def contact_sheet(dataset: str | Manifest, split: str = "train", *, seed: int = 0, per_class: int = PER_CLASS,
                  max_classes: int = MAX_CLASSES, max_records: int = MAX_RECORDS) -> Image.Image:
    """A split's contact sheet as a Pillow image (e.g. the last line of a notebook cell)."""
    m = dataset if isinstance(dataset, Manifest) else load(dataset)
    sample = sample_split(m, split, seed=seed, per_class=per_class, max_classes=max_classes, max_records=max_records)
    return render_sheet(sample)[0]
