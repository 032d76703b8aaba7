"""The work each peer does per image, in the three modes tpu-shards is compared in (Pillow only: this module runs
in the peers' environment as well as the project's).

- pass-through: the file's bytes as they are (tpu-shards: `--validate structure`);
- decode: the bytes kept, after decoding every byte of the JPEG at 1/8 scale (tpu-shards: `--validate decode`);
- reencode: decoded (drafted to no less than the target), centre-cropped and resized to SIDE x SIDE with bicubic
  filtering, saved as JPEG at QUALITY (tpu-shards: `--image-size 224 --jpeg-quality 75`, `--resize fill`).
"""
from __future__ import annotations

import io
import math
import os

from PIL import Image

MODES = ("pass", "decode", "reencode")
SIDE = 224
QUALITY = 75


def files_in(root: str) -> list[str]:
    """Every file under root, sorted: `<label>/<image>` as tpu-shards lists it."""
    return sorted(os.path.join(d, f) for d, _, names in os.walk(root) for f in names)


def label_ids(root: str) -> dict[str, int]:
    """Label folder name -> id, in sorted order (tpu-shards' own numbering)."""
    return {name: i for i, name in enumerate(sorted(os.listdir(root)))}


def checked(data: bytes) -> None:
    """Decode every byte of a JPEG at 1/8 scale, as `--validate decode` does; a bad file raises."""
    with Image.open(io.BytesIO(data)) as image:
        width, height = image.size
        image.draft(image.mode, (max(1, width // 8), max(1, height // 8)))
        image.load()


def reencoded(data: bytes, side: int = SIDE, quality: int = QUALITY) -> bytes:
    """The image decoded, cropped to the centre square, resized to side x side and saved as JPEG at quality."""
    with Image.open(io.BytesIO(data)) as image:
        width, height = image.size
        scale = side / min(width, height)
        box = image.draft("RGB", (math.ceil(width * scale), math.ceil(height * scale)))
        image.load()
        left, top, right, bottom = box[1] if box else (0, 0, width, height)
        crop = min(right - left, bottom - top)
        x, y = left + (right - left - crop) / 2, top + (bottom - top - crop) / 2
        small = image.convert("RGB").resize((side, side), Image.Resampling.BICUBIC, box=(x, y, x + crop, y + crop),
                                            reducing_gap=3.0)
    out = io.BytesIO()
    small.save(out, "JPEG", quality=quality)
    return out.getvalue()


def image_bytes(path: str, mode: str) -> bytes:
    """What a peer stores for the image at path in `mode`."""
    with open(path, "rb") as f:
        data = f.read()
    if mode == "decode":
        checked(data)
    elif mode == "reencode":
        return reencoded(data)
    return data
