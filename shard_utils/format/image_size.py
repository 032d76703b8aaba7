"""The size every image of a dataset is resized to, (height, width): parsed once from `--image-size`, carried as an
`ImageSize`, recorded in the manifest as [height, width], and held to what a loader can allocate per image."""
from __future__ import annotations

from typing import NamedTuple

__all__ = ["MAX_IMAGE_SIDE", "MAX_IMAGE_PIXELS", "ImageSize", "parse_image_size"]

MAX_IMAGE_SIDE = 65535  # JPEG's limit, and --image-size's
MAX_IMAGE_PIXELS = 2**28  # height x width: what a loader allocates per image (x3 channels, x4 as float)


class ImageSize(NamedTuple):
    """(height, width), each in 1..MAX_IMAGE_SIDE; see `problem` for the whole rule."""

    height: int
    width: int

    def problem(self) -> str | None:
        """Why this size cannot be a dataset's (a side out of range, or more pixels than a loader allocates per
        image); None when it can."""
        if not all(1 <= side <= MAX_IMAGE_SIDE for side in self):
            return f"each side must be in 1..{MAX_IMAGE_SIDE}"
        if self.height * self.width > MAX_IMAGE_PIXELS:
            return f"{self.height}x{self.width} is more than {MAX_IMAGE_PIXELS} pixels per image"
        return None


def parse_image_size(text: str) -> ImageSize:
    """`--image-size` as typed: "224" (a square) or "224,160" (height, width); ValueError in one line when it is
    not a size a dataset can have."""
    try:
        sides = [int(v) for v in text.split(",")]
    except ValueError:
        sides = []
    if len(sides) not in (1, 2) or not all(1 <= side <= MAX_IMAGE_SIDE for side in sides):
        raise ValueError(f"{text!r} must be 1 or 2 integers in 1..{MAX_IMAGE_SIDE}")
    size = ImageSize(sides[0], sides[-1])
    problem = size.problem()
    if problem is not None:
        raise ValueError(problem)
    return size
