"""The pixels of a JPEG with a plain header (shard_utils.format.jpeg), from Pillow's JPEG decoder called directly:
what Image.open, draft and load give, without Pillow's Python parse of the header. The build's decode check and the
readers' Pillow path both decode this way."""
from __future__ import annotations

from PIL import Image, ImageFile

from shard_utils.format.jpeg import PlainHeader

__all__ = ["draft_scale", "decoded_plain"]


def draft_scale(width: int, height: int, draft: tuple[int, int]) -> int:
    """The scale (8, 4, 2 or 1) Pillow's JpegImageFile.draft picks to decode a width x height JPEG at least `draft`
    (width, height): 1 where even that is smaller than `draft`."""
    fits = min(width // draft[0], height // draft[1])
    return next((s for s in (8, 4, 2) if fits >= s), 1)


def decoded_plain(data: bytes, found: PlainHeader, draft: tuple[int, int]) -> Image.Image | None:
    """The pixels of a plain JPEG as Image.open, draft(mode, `draft`) and load() give them: the same decoder with the
    same arguments (its mode, the scale draft picks, no decoder-side draft), fed the whole of `data` at once (the
    decoder stops at the end-of-image marker) into an image it fills; None when the decoder does not finish cleanly."""
    if ImageFile.LOAD_TRUNCATED_IMAGES:  # Pillow's load then finishes damaged pixels: its path decides
        return None
    mode = "L" if found.components == 1 else "RGB"
    scale = draft_scale(found.width, found.height, draft)
    size = (-(-found.width // scale), -(-found.height // scale))
    try:
        image = Image.new(mode, size, None)  # not filled, as Image.open's load leaves it: the decoder writes every row
        image.frombytes(data, "jpeg", mode, "", scale, 0)
        return image
    except (ValueError, OSError, MemoryError):  # unfinished or broken data, or no memory: reported by Pillow's path
        return None
