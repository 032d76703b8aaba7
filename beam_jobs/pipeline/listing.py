"""ListMedia and ListListedMedia: what to encode, as chunks of MediaItems, with rejects, skips and labels.

A folder or bucket is listed in parallel from the start: the root's level is one element, each sub-folder
it holds becomes an element of the next stage, and the last stage walks what is left of each sub-tree.
On gs:// a task lists at most a few pages; the rest of its range is cut into ranges of names chosen from
the names it saw (`shard_utils.storage.ranges`), each an element of the next stage, which cuts its own rest
again. A level holding mostly sub-folders (one per sample, per user) is listed flat, range by range, not
one request per sub-folder. A listing file (CSV, JSONL, Avro) is read by Beam's splittable sources.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import apache_beam as beam

from beam_jobs import progress
from beam_jobs.pipeline.common import count, rejected
from beam_jobs.pipeline.listing_sources import DropDuplicateRows, ListingItems
from beam_jobs.run.config import BuildConfig
from beam_jobs.run.tally import Tally
from shard_utils import storage
from shard_utils.errors import InternalError
from shard_utils.inputs import MediaItem
from shard_utils.inputs import walk as media_listing
from shard_utils.inputs.items import Entries, MediaItems
from shard_utils.storage import ranges

__all__ = ["ListMedia", "ListListedMedia", "DistinctLabels"]

LIST_CHUNK = 256  # items per element
PAGES_PER_TASK = 10  # gs:// pages one worker lists of a range before cutting the rest into ranges
CUTS_PER_TASK = 64  # most ranges one task hands on
STAGES = 5  # the last walks what is left uncut; at 10^7 (benchmarks/scale_sim) date folders yyyy/mm/dd/hh reach it


@dataclass(frozen=True)
class ListTask:
    """A folder to list (relative to the input; "" is the input), or a range of names of its level."""

    folder: str
    after: tuple[str, bool] | None = None  # (name, inclusive); a sub-folder 'a/', not inclusive: after all it holds
    end: str | None = None
    flat: bool = False  # every file under the range's names, at any depth, not the level's alone


class ListMedia(beam.PTransform):
    """The input walked in parallel (see the module's docstring) and sorted into media and the rest.

    Outputs: `media` (MediaItems chunks), `rejected` (dict), `skipped_files` (dict naming a non-media
    file), `tally` (Tally per chunk), `labels` (each label name once)."""

    def __init__(self, config: BuildConfig):
        super().__init__()
        self.config = config

    def expand(self, pbegin):
        cfg = self.config
        tasks = pbegin | "Root" >> beam.Create([ListTask("")])
        chunks = []
        for stage in range(1, STAGES + 1):
            listed = (tasks
                      | f"Spread{stage}" >> beam.Reshuffle()
                      | f"List{stage}" >> beam.FlatMap(list_task, cfg, stage == STAGES).with_outputs(
                          "tasks", main="entries"))
            chunks.append(listed.entries)
            tasks = listed.tasks
        out = (chunks | "AllEntries" >> beam.Flatten()
               | "Classify" >> beam.FlatMap(classify_chunk, cfg).with_outputs(
                   "rejected", "skipped_files", "tally", main="media"))
        labels = out.media | "DistinctLabels" >> DistinctLabels()
        return {"media": out.media, "rejected": out.rejected, "skipped_files": out.skipped_files, "tally": out.tally,
                "labels": labels}


def list_task(task: ListTask, config: BuildConfig, final: bool) -> Iterator:
    """The entries a task finds (chunks of storage.Entry) and, tagged `tasks`, the tasks it leaves: its
    sub-folders, and the ranges of names it did not finish."""
    root, follow = input_folder(config), config.follow_symlinks
    if final:
        walked = storage.walk(root, follow, start=task.folder, after=task.after, end=task.end) \
            if (task.after or task.end) else storage.walk(root, follow, start=task.folder)
        yield from listed(chunked(walked))
        return
    entries, folders, more = storage.list_level(root, task.folder, follow, after=task.after, end=task.end,
                                                max_pages=PAGES_PER_TASK, flat=task.flat)
    keep, tasks = (True, [ListTask(folder) for folder in folders]) if more is None else rest_of(
        task, entries, folders, more)
    if keep:
        yield from listed(chunked(entries))
    for found in tasks:
        yield beam.pvalue.TaggedOutput("tasks", found)


def rest_of(task: ListTask, entries: list[storage.Entry], folders: list[str], more: str) -> tuple[bool, list[ListTask]]:
    """(whether the entries listed are kept, the tasks that list the rest) of a task that stopped at `more`.

    A level: its sub-folders, and the rest of its names in ranges; a level of more sub-folders than files is
    handed on whole, as flat ranges (its entries are listed again there). A flat range: the rest in ranges
    cut from the names seen; when every page lay in one sub-folder, the rest of that sub-folder (flat) and
    the rest of the level after it (a level again, to find what else it holds)."""
    level = task.folder.rstrip("/") + "/" if task.folder else ""
    if task.flat:
        keys = sorted({ranges.level_key(e.rel_path, level) for e in entries})
        if len(keys) == 1 and "/" in more[len(level):]:
            sub = level + keys[0]
            return True, [ListTask(sub, (more, False), None, flat=True), ListTask(task.folder, (sub + "/", False),
                                                                                   task.end)]
        cuts = ranges.cut_points(level, keys, CUTS_PER_TASK)
        return True, split(task, (more, False), cuts, flat=True)
    keys = sorted({ranges.level_key(name, level) for name in [e.rel_path for e in entries] + folders})
    if len(folders) > len(entries):
        cuts = ranges.cut_points(level, keys, CUTS_PER_TASK, seen_too=True)
        return False, split(task, task.after, cuts, flat=True)
    cuts = ranges.cut_points(level, keys, CUTS_PER_TASK)
    return True, [ListTask(folder) for folder in folders] + split(task, (more, False), cuts, flat=False)


def split(task: ListTask, after: tuple[str, bool] | None, cuts: list[str], flat: bool) -> list[ListTask]:
    """Tasks for the ranges the cuts make of (after, task.end) in the task's folder."""
    return [ListTask(task.folder, start, stop, flat) for start, stop in ranges.ranges_between(after, cuts, task.end)]


def listed(chunks: Iterable[list]) -> Iterator[Entries]:
    """The chunks, each counted on the progress bar as it is listed (not when the listing is over)."""
    for chunk in chunks:
        progress.advance("list", len(chunk))
        yield Entries(chunk)


def input_folder(config: BuildConfig) -> str:
    """The folder ListMedia walks: --input (a build from listings reads them instead, and walks nothing)."""
    if config.input is None:
        raise InternalError("the input folder is walked, but the build has none (it reads listings)")
    return config.input


def chunked(entries: Iterable, size: int = LIST_CHUNK) -> Iterator[list]:
    it = iter(entries)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


def classify_chunk(entries: Sequence[storage.Entry], config: BuildConfig):
    """A chunk of walked entries as ListMedia's outputs: tagged rejects, skipped names and tally, then its media."""
    found = media_listing.sort_chunk(entries, config.split_dirs, input_folder(config), config.listing,
                                     config.video is not None)
    tally = Tally(seen=found.seen)
    count("files_matched", found.seen)
    for entry in found.rejected:
        yield rejected(entry)
    for source, reason, extension in found.skipped:
        count(f"skipped_{reason}")
        tally.skip(reason, extension)
        if reason in ("not_media", "still_image"):
            yield beam.pvalue.TaggedOutput("skipped_files", {"source": source, "reason": reason})
    yield beam.pvalue.TaggedOutput("tally", tally)
    if found.media:
        progress.expect("encode", len(found.media))
        yield found.media


class ListListedMedia(beam.PTransform):
    """The media a --listing names (the input is not walked): one item per row, a row naming a file again
    rejected `duplicate_row`; same outputs as ListMedia (every row is seen once)."""

    def __init__(self, config: BuildConfig):
        super().__init__()
        self.config = config

    def expand(self, pbegin):
        rows = pbegin | "ListingItems" >> ListingItems(self.config.listing, self.config.input)
        unique = rows.items | "DropDuplicateRows" >> DropDuplicateRows()  # MediaItem
        seen = ((rows.items, rows.rejected) | "AllRows" >> beam.Flatten()
                | "CountRows" >> beam.combiners.Count.Globally()
                | "Tally" >> beam.Map(lambda n: Tally(seen=n)))
        media = (unique.items
                 | "Chunk" >> beam.BatchElements(min_batch_size=LIST_CHUNK, max_batch_size=LIST_CHUNK)
                 | "CountChunk" >> beam.Map(_listed_chunk))
        rejects = ((rows.rejected, unique.rejected) | "AllRowRejects" >> beam.Flatten()
                   | "CountRejects" >> beam.Map(lambda r: rejected(r).value))
        nothing = pbegin | "NoSkippedFiles" >> beam.Create([])
        labels = media | "DistinctLabels" >> DistinctLabels()
        return {"media": media, "rejected": rejects, "skipped_files": nothing, "tally": seen, "labels": labels}


def _listed_chunk(chunk: list[MediaItem]) -> MediaItems:
    count("files_matched", len(chunk))
    progress.expect("encode", len(chunk))
    return MediaItems(chunk)


class DistinctLabels(beam.PTransform):
    """The label names of all media, each once (what the encoder's label ids are made from)."""

    def expand(self, media):
        return (media
                | "LabelsOf" >> beam.FlatMap(label_names)
                | "Distinct" >> beam.Distinct())


def label_names(chunk: Iterable[MediaItem]) -> set[str]:
    """The label names of a chunk's items, read from its labels column (the items are not made)."""
    return {name for labels in set(MediaItems.of(chunk).labels) for name in labels}
