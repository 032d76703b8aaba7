"""Read a dataset as a training script would, in a process of its own (tests run it under time and memory
limits): `read_with.py loader DATASET` (one evaluation pass of the tf.data loader over the first split) or
`read_with.py random_access DATASET` (record 0 of every split through the Grain source). Prints what it read;
an exception is one line on stderr and exit 1."""
from __future__ import annotations

import sys


def loader(dataset: str) -> int:
    from shard_utils.read.loader import load_manifest, make_dataset

    m = load_manifest(dataset)
    return sum(1 for _ in make_dataset(m, sorted(m.splits)[0], 1, training=False, repeat=False, image_size=8))


def random_access(dataset: str) -> list[int]:
    from shard_utils.read.random_access import sources

    return [len(source[0]) for source in sources(dataset).values()]


if __name__ == "__main__":
    how, dataset = sys.argv[1:]
    try:
        print({"loader": loader, "random_access": random_access}[how](dataset))
    except Exception as exc:  # noqa: BLE001 - the test reads the one line
        print(f"{type(exc).__name__}: {exc}".splitlines()[0], file=sys.stderr)
        sys.exit(1)
