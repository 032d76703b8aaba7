"""The static output size of decoded images, shared by the tf.data loader and the JAX iterator (no TensorFlow)."""
from __future__ import annotations

from collections.abc import Sequence

from shard_utils.format.manifest import Manifest

__all__ = ["target_size"]


def target_size(m: Manifest, image_size: int | Sequence[int] | None) -> tuple[int, int]:
    """(height, width) of the output: as asked, else the manifest's fixed size, else a clear error."""
    if image_size is None:
        if m.image_size is None:
            raise ValueError("this dataset's images vary in size (its manifest records no image_size), and TPUs need "
                             "static shapes: pass image_size=(height, width), e.g. image_size=224")
        return int(m.image_size[0]), int(m.image_size[1])
    hw = [image_size, image_size] if isinstance(image_size, int) else list(image_size)
    if len(hw) != 2 or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in hw):
        raise ValueError(f"image_size must be a positive int or (height, width), got {image_size!r}")
    return hw[0], hw[1]
