"""The dataset card, `README.md` beside the data, derived from the manifest alone: YAML front matter (the keys
Hugging Face and Kaggle display), what the dataset holds, counts per split and label, how it was built, how to
load it, and what was rejected. Prose for people: nothing reads it back."""
from __future__ import annotations

import json
import re
from typing import Any

from shard_utils.format import croissant
from shard_utils.format.filenames import CROISSANT_NAME, MANIFEST_NAME
from shard_utils.format.manifest import Manifest
from shard_utils.format.shard_formats import ARRAY_RECORD, TFRECORD
from shard_utils.read.tfds_meta import split_expression

__all__ = ["MAX_LABEL_ROWS", "card_bytes", "card", "command_line"]

MAX_LABEL_ROWS = 50  # the label table's rows; the rest are counted in one line
_SPDX = re.compile(r"^[A-Za-z0-9.+-]{1,64}$")  # a licence identifier Hugging Face takes as `license:`


def card_bytes(m: Manifest) -> bytes:
    """`README.md`'s bytes."""
    return card(m).encode("utf-8")


def card(m: Manifest) -> str:
    """The dataset card's Markdown."""
    given = croissant.metadata(m)
    name = croissant.dataset_name(m)
    parts = [_front_matter(m, given, name), f"# {_line(name)}\n", _line(given.get("description") or
                                                                        croissant.summary(m)) + "\n",
             _contents(m), _labels(m), _built(m), _loading(m), _rejected(m)] + _quality(m)
    if given.get("citation"):
        parts.append(f"## Citation\n\n```\n{given['citation'].replace('```', '')}\n```\n")
    return "\n".join(parts)


def _line(text: str) -> str:
    return " ".join(str(text).split())


def _cell(text: Any) -> str:
    return _line(str(text)).replace("|", "\\|")


def _front_matter(m: Manifest, given: dict[str, str], name: str) -> str:
    """YAML, every value JSON-quoted (JSON strings are YAML strings), so no label or name can break it."""
    lines = ["---", f"pretty_name: {json.dumps(_line(name))}"]
    licence = given.get("license")
    if licence and _SPDX.match(licence):
        lines.append(f"license: {json.dumps(licence.lower())}")
    elif licence:
        lines += ["license: other", f"license_link: {json.dumps(licence)}"]
    task = "video-classification" if m.media == "video" else "image-classification"
    lines += ["task_categories:", f"- {task}", "tags:", "- tpu-shards", *(f"- {f}" for f in m.formats),
              f"size_categories:\n- {_size_category(sum(s.num_records for s in m.splits.values()))}", "---\n"]
    return "\n".join(lines)


def _size_category(n: int) -> str:
    for limit, name in ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M"),
                        (10_000_000, "1M<n<10M"), (100_000_000, "10M<n<100M")):
        if n < limit:
            return name
    return "n>100M"


def _contents(m: Manifest) -> str:
    rows = ["| split | records | shards | MB |", "|---|---:|---:|---:|"]
    rows += [f"| {_cell(name)} | {s.num_records} | {len(s.shards)} | {s.num_bytes / 1e6:.1f} |"
             for name, s in m.splits.items()]
    size = f"{m.image_size[0]}x{m.image_size[1]}" if m.image_size else "as found (not resized)"
    return (f"## Contents\n\n{len(m.labels)} labels{' (multi-label)' if m.multi_label else ''}, images {size}, "
            f"{' and '.join(m.formats)} shards.\n\n" + "\n".join(rows) + "\n")


def _labels(m: Manifest) -> str:
    if not m.labels:
        return "## Labels\n\nNone: the records are unlabeled.\n"
    splits = list(m.splits)
    rows = [f"| id | label | {' | '.join(_cell(s) for s in splits)} |", "|---:|---|" + "---:|" * len(splits)]
    for i, label in enumerate(m.labels[:MAX_LABEL_ROWS]):
        counts = " | ".join(str(m.splits[s].class_counts.get(label, 0)) for s in splits)
        rows.append(f"| {i + m.label_offset} | {_cell(label)} | {counts} |")
    more = len(m.labels) - MAX_LABEL_ROWS
    tail = f"\n\n... and {more} more labels (every count is in {MANIFEST_NAME})" if more > 0 else ""
    return "## Labels\n\n" + "\n".join(rows) + tail + "\n"


def command_line(m: Manifest) -> str:
    """The build's command line as the manifest's options record it (defaults included; an option the manifest
    records under another name than its flag's shows under the recorded name)."""
    args = ["tpu-shards", "build", m.input or "INPUT", "OUTPUT"]
    for key, value in m.options.items():
        if value is None or value is False or value == [] or value == "" or key == "metadata" or (
                key == "splits" and isinstance(value, str)):  # "from folders": the input's layout, not a flag
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
            continue
        if isinstance(value, dict):
            value = ",".join(f"{k}={v}" for k, v in value.items())
        elif isinstance(value, list):
            value = ",".join(map(str, value))
        args += [flag, str(value)]
    return " ".join(_quoted(a) for a in args)


def _quoted(arg: str) -> str:
    return arg if re.fullmatch(r"[A-Za-z0-9_./:=,+@%-]+", arg) else "'" + arg.replace("'", "'\\''") + "'"


def _built(m: Manifest) -> str:
    generations = m.generations or []
    appends = "".join(f"- append {g.generation} on {g.created}: {sum(g.num_records.values())} records from "
                      f"{_line(g.input)}\n" for g in generations[1:])
    return (f"## How it was built\n\n{croissant.provenance(m)}\n\nThe build's options, as {MANIFEST_NAME} records "
            f"them:\n\n```\n{command_line(m)}\n```\n" + (f"\n{appends}" if appends else ""))


def _loading(m: Manifest) -> str:
    split = "train" if "train" in m.splits else next(iter(m.splits))
    out = ["## Loading\n", "tf.data (`pip install tpu-shards[tf]`):\n", "```python", "from shard_utils import loader",
           'manifest = loader.load_manifest("PATH/TO/THIS/FOLDER")',
           f'ds = loader.make_dataset(manifest, "{split}", 64)  # (image, label) batches',
           "for images, labels in ds.take(1).as_numpy_iterator():  # JAX: NumPy batches",
           "    print(images.shape, labels[:8])", "```\n"]
    if TFRECORD.name in m.formats:
        out += ["Grain (random access through the index):\n", "```python", "import grain",
                "from shard_utils.random_access import Decoder, RandomAccessSource",
                f'src = RandomAccessSource("PATH/TO/THIS/FOLDER", "{split}")',
                "ds = grain.MapDataset.source(src).seed(0).shuffle().map(Decoder.for_source(src)).batch(256)", "```\n"]
    if ARRAY_RECORD.name in m.formats:
        out += ["Grain over the ArrayRecord shards:\n", "```python", "import grain",
                "from shard_utils.format.manifest import load", 'm = load("PATH/TO/THIS/FOLDER")',
                f'source = grain.sources.ArrayRecordDataSource(m.array_record_paths("{split}"))', "```\n"]
    out += ["TFDS (a split grown by appends is one TFDS split per generation):\n", "```python",
            "import tensorflow_datasets as tfds",
            f'ds = tfds.builder_from_directory("PATH/TO/THIS/FOLDER").as_dataset(split="{split_expression(m, split)}")',
            "```\n",
            f"{MANIFEST_NAME} is the dataset's contract (every file's size and checksums); {CROISSANT_NAME} "
            "describes it in Croissant 1.0.\n"]
    return "\n".join(out)


def _quality(m: Manifest) -> list[str]:
    """The quality checks' counts by kind (none for a build without them)."""
    if m.quality is None:
        return []
    rows = [f"- {_cell(kind)}: {n}" for kind, n in m.quality.get("by_kind", {}).items() if n]
    listed = f", each listed in {m.quality['path']}" if m.quality.get("path") and rows else ""
    return [f"## Quality\n\n{m.quality.get('count', 0)} findings (near-duplicates, label conflicts, flagged "
            f"images){listed}.\n" + ("\n" + "\n".join(rows) + "\n" if rows else "")]


def _rejected(m: Manifest) -> str:
    rows = [f"- {_cell(reason)}: {n}" for reason, n in sorted(m.rejected.get("by_reason", {}).items())]
    dups = m.duplicates or {}
    dup = f"\nNear-duplicates dropped (--dedup): {dups.get('count', 0)}.\n" if dups else ""
    listed = f" (each listed in {m.rejected['path']})" if m.rejected.get("path") and rows else ""
    return (f"## Rejected and skipped\n\n{m.files_seen} files seen: {sum(s.num_records for s in m.splits.values())} "
            f"records, {m.rejected.get('count', 0)} rejected{listed}, {m.skipped.get('count', 0)} skipped.\n"
            + ("\n" + "\n".join(rows) + "\n" if rows else "") + dup)
