"""One peer writing one folder of images, as a whole process (run with the peers' Python):

    python -m peers_bench.child TOOL MODE INPUT OUTPUT WORKERS

TOOL: webdataset (`ShardWriter`, one per worker process), tfds (a `GeneratorBasedBuilder`, one process: its
default writer has no workers), mds (MosaicML streaming's `MDSWriter`, one per worker into its own folder, then
`merge_index`, as streaming's guide for parallel writing does) or litdata (`optimize` with `num_workers`).
Each stores per image the bytes peers_bench.work.image_bytes gives in MODE and the label's id. Exits 3 with
one line `missing: ...` when the tool cannot be imported, so that the benchmark reports it as missing.
"""
from __future__ import annotations

import functools
import multiprocessing
import os
import sys

from peers_bench.work import MODES, files_in, image_bytes, label_ids

TOOLS = ("webdataset", "tfds", "mds", "litdata")
SHARD_BYTES = 64 * 1000 * 1000  # where a tool takes a shard size; TFDS chooses its own
MISSING = 3  # the exit status of a tool that cannot be imported


def labelled(path: str, labels: dict[str, int]) -> int:
    return labels[os.path.basename(os.path.dirname(path))]


def key_of(path: str) -> str:
    """A sample key without dots or slashes (webdataset splits a member's name at its first dot)."""
    return f"{os.path.basename(os.path.dirname(path))}_{os.path.splitext(os.path.basename(path))[0]}"


def in_parts(part, jobs: list[tuple]) -> None:
    """Run part over jobs, one worker process each (inline for one)."""
    if len(jobs) == 1:
        part(jobs[0])
        return
    with multiprocessing.get_context("fork").Pool(len(jobs)) as pool:
        pool.map(part, jobs, chunksize=1)


def _webdataset_part(job: tuple) -> None:
    import webdataset as wds

    k, paths, labels, mode, out = job
    with wds.ShardWriter(os.path.join(out, f"part{k}-%06d.tar"), maxsize=SHARD_BYTES, verbose=0) as sink:
        for path in paths:
            sink.write({"__key__": key_of(path), "jpg": image_bytes(path, mode), "cls": labelled(path, labels)})


def webdataset(paths: list[str], labels: dict[str, int], mode: str, out: str, workers: int) -> None:
    import webdataset  # noqa: F401 - a missing tool fails here, before any worker starts

    in_parts(_webdataset_part, [(k, paths[k::workers], labels, mode, out) for k in range(workers)])


def _mds_part(job: tuple) -> None:
    from streaming import MDSWriter

    k, paths, labels, mode, out = job
    columns = {"key": "str", "image": "bytes", "label": "int"}
    with MDSWriter(out=os.path.join(out, str(k)), columns=columns, size_limit=SHARD_BYTES) as sink:
        for path in paths:
            sink.write({"key": key_of(path), "image": image_bytes(path, mode), "label": labelled(path, labels)})


def mds(paths: list[str], labels: dict[str, int], mode: str, out: str, workers: int) -> None:
    from streaming.base.util import merge_index

    in_parts(_mds_part, [(k, paths[k::workers], labels, mode, out) for k in range(workers)])
    merge_index(out, keep_local=True)  # the partitions under out, into out/index.json


def _litdata_item(path: str, labels: dict[str, int], mode: str) -> dict:
    return {"key": key_of(path), "image": image_bytes(path, mode), "label": labelled(path, labels)}


def litdata(paths: list[str], labels: dict[str, int], mode: str, out: str, workers: int) -> None:
    from litdata import optimize

    optimize(fn=functools.partial(_litdata_item, labels=labels, mode=mode), inputs=paths, output_dir=out,
             num_workers=workers, chunk_bytes=SHARD_BYTES, verbose=False)


def tfds(paths: list[str], labels: dict[str, int], mode: str, out: str, workers: int) -> None:
    import tensorflow_datasets as tf_datasets
    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.ERROR)
    tf_datasets.disable_progress_bar()

    class PeerImages(tf_datasets.core.GeneratorBasedBuilder, skip_registration=True):
        """Labelled images from class folders, stored as JPEG."""

        VERSION = tf_datasets.core.Version("1.0.0")
        RELEASE_NOTES = {"1.0.0": "benchmark"}

        def _info(self) -> tf_datasets.core.DatasetInfo:
            return tf_datasets.core.DatasetInfo(builder=self, features=tf_datasets.features.FeaturesDict({
                "image": tf_datasets.features.Image(encoding_format="jpeg"),
                "label": tf_datasets.features.ClassLabel(names=sorted(labels, key=labels.get))}))

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples()}

        def _generate_examples(self):
            for path in paths:  # pass-through yields the path: TFDS reads the bytes and keeps them as they are
                image = path if mode == "pass" else image_bytes(path, mode)
                yield key_of(path), {"image": image, "label": labelled(path, labels)}

    PeerImages(data_dir=out).download_and_prepare()


def main(argv: list[str]) -> int:
    tool, mode, source, out, workers = argv
    if tool not in TOOLS or mode not in MODES:
        print(f"unknown tool {tool!r} or mode {mode!r}", file=sys.stderr)
        return 2
    try:
        writer = globals()[tool]
        paths = files_in(source)
        writer(paths, label_ids(source), mode, out, int(workers))
    except ImportError as exc:  # the tool or one of its dependencies is not installed
        print(f"missing: {exc}", file=sys.stderr)
        return MISSING
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
