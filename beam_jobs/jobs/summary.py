"""What a finished job prints: its summary lines and its Beam counters."""
from __future__ import annotations

from shard_utils import inputs, storage
from shard_utils.format import labels, manifest, shard_formats
from shard_utils.text import printable

__all__ = [
    "COUNTER_ORDER", "counter_totals", "metrics_summary", "formats_text", "shard_kind", "twins_line",
    "shard_noun", "counted", "shards_of", "split_name_notes", "label_ids_line", "summary"
]

COUNTER_ORDER = ("files_matched", "images_written", "shards_written", "bytes_written",
                 "images_passed_through", "images_reencoded", "jpeg_trailers_dropped",
                 "shard_bytes_copied")


def counter_totals(result) -> dict[str, int]:
    """The job's Beam counters (namespace tpu_shards), summed over steps; empty if the runner has none."""
    from apache_beam.metrics.metric import MetricsFilter

    from beam_jobs.run.tally import NAMESPACE

    try:
        found = result.metrics().query(MetricsFilter().with_namespace(NAMESPACE))["counters"]
    except Exception:  # noqa: BLE001 - a runner without metrics support must not fail a finished build
        return {}
    totals: dict[str, int] = {}
    for c in found:
        value = c.committed if c.committed is not None else c.attempted
        totals[c.key.metric.name] = totals.get(c.key.metric.name, 0) + int(value or 0)
    return totals


def metrics_summary(result) -> str:
    """One line of the job's Beam counters: files matched, images and bytes written, rejects by reason."""
    totals = counter_totals(result)
    names = [n for n in COUNTER_ORDER if n in totals] + sorted(n for n in totals if n not in COUNTER_ORDER)
    return ("  counters: " + ", ".join(f"{n} {totals[n]}" for n in names)) if names else ""


def formats_text(m: manifest.Manifest) -> str:
    """The dataset's shard formats in words: "TFRecord shards", "ArrayRecord shards", "TFRecord and ArrayRecord
    shards"."""
    return " and ".join(shard_formats.get(f).title for f in m.formats) + " shards"


def shard_kind(m: manifest.Manifest) -> str:
    """" ArrayRecord" when a dataset's `shards` are ArrayRecord files, else "" (they are TFRecord)."""
    return "" if m.first_format is shard_formats.FIRST else f" {m.first_format.title}"


def twins_line(twins: list[manifest.Shard] | None) -> list[str]:
    """The line naming a split's (or a generation's) ArrayRecord twins and their size; none without twins."""
    return [f"    and their ArrayRecord twins, {sum(s.num_bytes for s in twins) / 1e6:.1f} MB"] if twins else []


def shard_noun(m: manifest.Manifest) -> str:
    """"shard", or "ArrayRecord shard" when a dataset's `shards` are ArrayRecord files."""
    return (shard_kind(m) + " shard").strip()


def counted(n: int, noun: str) -> str:
    """"1 record", "2 records"."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def shards_of(m: manifest.Manifest, shards: list[manifest.Shard]) -> str:
    """"8 shards of 9/10 records", "1 ArrayRecord shard of 1 record": how many shards and what they hold."""
    sizes = sorted({s.num_records for s in shards})
    return (f"{counted(len(shards), shard_noun(m))} of {'/'.join(map(str, sizes))} "
            f"{'record' if sizes == [1] else 'records'}")


def split_name_notes(split_names) -> list[str]:
    """A note for each split named one edit (or an alias) away from train, validation or test: loaders and
    TFDS code ask for the usual names. The name is kept as given."""
    return [f"  note: split {name!r} is not {usual!r}; loaders asking for {usual!r} will not find it"
            for name in split_names for usual in [inputs.usual_split_meant(name)] if usual]


def label_ids_line(names: list[str]) -> list[str]:
    """The line saying which id each numeric label got, when an id is not the label itself; none otherwise."""
    mapping = labels.renumbered(names)
    if not mapping:
        return []
    return [f"  label ids: {printable(mapping)} "
            "(ids follow the labels' numeric order; manifest.labels[id] is the label)"]


def summary(m: manifest.Manifest, seconds: float, runner: str, workers: int = 1) -> str:
    """A few lines a person reads at the end of a local run."""
    how = f"{runner}, {workers} encode processes" if workers > 1 else runner
    lines = [f"tpu-shards: wrote {m.location} in {seconds:.1f}s ({how})"]
    for name, split in m.splits.items():
        unlabeled = "" if split.labeled else " (unlabeled)"
        lines.append(f"  {name}: {counted(split.num_records, 'record')}{unlabeled} in {shards_of(m, split.shards)}, "
                     f"{split.num_bytes / 1e6:.1f} MB")
        lines += twins_line(split.array_record_shards)
    lines += label_ids_line(m.labels)

    lines += split_name_notes(m.splits)

    def reasons(part: dict) -> str:
        return f" ({', '.join(f'{k} {v}' for k, v in part.get('by_reason', {}).items())})" if part["count"] else ""

    extensions = m.skipped.get("by_extension") or {}
    not_media = f"; not media: {', '.join(f'{printable(k)} {v}' for k, v in extensions.items())}" if extensions else ""
    lines.append(f"  files seen {m.files_seen}: rejected {m.rejected['count']}{reasons(m.rejected)}, "
                 f"skipped {m.skipped['count']}{reasons(m.skipped)}{not_media}")
    if m.rejected["count"]:
        lines.append(f"  see {storage.join(m.location, m.rejected['path'])} for why each file was rejected")
    if m.skipped.get("path"):
        lines.append(f"  skipped files are listed in {storage.join(m.location, m.skipped['path'])}")
    cross = (m.duplicates or {}).get("cross_split") or {}
    if cross:
        pairs = ", ".join(f"{pair.replace('|', '/')} {n}" for pair, n in cross.items())
        lines.append(f"  warning: {sum(cross.values())} duplicate files were in two splits ({pairs}): the same image "
                     "in training and evaluation data; each was kept once")
    return "\n".join(lines)
