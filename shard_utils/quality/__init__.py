"""Data quality of the images a build sees: a perceptual signature per image, flags on its pixels, and the
findings a build writes to `quality.jsonl`. Pure functions on pixels and dicts: no Beam, no I/O."""

__all__: list[str] = []
