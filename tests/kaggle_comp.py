"""A Kaggle-shaped competition folder: `train.csv` (id,label with numeric labels), `train_images/<id>.jpg`, an
unlabeled `test_images/` folder and a `sample_submission.csv` listing the test ids in the competition's order."""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
from PIL import Image


def image(label: int, seed: int, size: int) -> Image.Image:
    """A small image whose mean colour says its label (so a tiny model can learn it), with some noise."""
    rng = np.random.default_rng(seed)
    hue = np.array([(label * 67) % 256, (label * 131 + 80) % 256, (label * 29 + 160) % 256], np.float64)
    pixels = hue + rng.normal(0, 12, (size, size, 3))
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")


def competition(root: Path, *, train: int = 60, test: int = 24, classes: int = 12, size: int = 16) -> Path:
    """Write the competition under root; test ids are shuffled so no sort of names gives the submission order."""
    rng = np.random.default_rng(7)
    (root / "train_images").mkdir(parents=True)
    (root / "test_images").mkdir()
    with open(root / "train.csv", "w", newline="") as f:
        rows = csv.writer(f)
        rows.writerow(["id", "label"])
        for i in range(train):
            label = i % classes
            name = f"tr{int(rng.integers(1 << 30)):09x}"
            image(label, i, size).save(root / "train_images" / f"{name}.jpg", quality=95)
            rows.writerow([name, label])
    ids = [f"te{int(rng.integers(1 << 30)):09x}" for _ in range(test)]
    for i, name in enumerate(ids):
        image(i % classes, 10_000 + i, size).save(root / "test_images" / f"{name}.jpg", quality=95)
    with open(root / "sample_submission.csv", "w", newline="") as f:
        rows = csv.writer(f)
        rows.writerow(["id", "label"])
        rows.writerows([name, 0] for name in ids)
    return root

