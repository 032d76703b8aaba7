"""ListMedia and ListListedMedia: what to encode, as chunks of MediaItems, with rejects, skips and labels.

A folder or bucket is listed in parallel from the start: the root's level is one element, each sub-folder
it holds becomes an element of the next stage, and the third stage walks what is left of each sub-tree.
On gs:// a level too large for one worker's few pages is cut into ranges of names, each an element of the
next stage. A listing file (CSV, JSONL, Avro) is read by Beam's splittable sources.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Iterable, Iterator

import apache_beam as beam

from shard_utils import storage
from shard_utils.inputs import MediaItem

from shard_utils.inputs import walk as media_listing
from beam_jobs import progress
from beam_jobs.jobs.config import BuildConfig
from beam_jobs.pipeline.listing_sources import DropDuplicateRows, ListingItems
from beam_jobs.publish import Tally
from beam_jobs.pipeline.common import Chunk, count, rejected

__all__ = ["ListMedia", "ListListedMedia", "DistinctLabels"]

LIST_CHUNK = 256  # items per element
PAGES_PER_TASK = 10  # gs:// pages one worker lists of a level before cutting the rest into ranges
RANGES_PER_SPLIT = 16
STAGES = 3  # the last stage walks what is left without cutting it further


@dataclass(frozen=True)
class ListTask:
    """A folder to list (relative to the input; "" is the input), or a range of names of its level."""

    folder: str
    after: tuple[str, bool] | None = None  # (name, inclusive)
    end: str | None = None


class ListMedia(beam.PTransform):
    """The input walked in parallel (see the module's docstring) and sorted into media and the rest.

    Outputs: `media` (list[MediaItem] chunks), `rejected` (dict), `skipped_files` (dict naming a non-media
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
    sub-folders, and the ranges of a level it did not finish."""
    root, follow = config.input, config.follow_symlinks
    if final:
        walked = storage.walk(root, follow, start=task.folder, after=task.after, end=task.end) \
            if (task.after or task.end) else storage.walk(root, follow, start=task.folder)
        yield from listed(chunked(walked))
        return
    entries, folders, more = storage.list_level(root, task.folder, follow, after=task.after, end=task.end,
                                                max_pages=PAGES_PER_TASK)
    yield from listed(chunked(entries))
    for folder in folders:
        yield beam.pvalue.TaggedOutput("tasks", ListTask(folder))
    if more is not None:
        cuts = storage.split_names(more, task.end, RANGES_PER_SPLIT)
        starts = [(more, False)] + [(c, True) for c in cuts]
        for start, stop in zip(starts, cuts + [task.end]):
            yield beam.pvalue.TaggedOutput("tasks", ListTask(task.folder, start, stop))


def listed(chunks: Iterable[list]) -> Iterator[Chunk]:
    """The chunks, each counted on the progress bar as it is listed (not when the listing is over)."""
    for chunk in chunks:
        progress.advance("list", len(chunk))
        yield Chunk(chunk)


def chunked(entries: Iterable, size: int = LIST_CHUNK) -> Iterator[list]:
    it = iter(entries)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


def classify_chunk(entries: list[storage.Entry], config: BuildConfig):
    """A chunk of walked entries as ListMedia's outputs: tagged rejects, skipped names and tally, then its media."""
    found = media_listing.sort_chunk(entries, config.split_dirs, config.input, config.listing,
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
        yield Chunk(found.media)


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


def _listed_chunk(chunk: list[MediaItem]) -> Chunk:
    count("files_matched", len(chunk))
    progress.expect("encode", len(chunk))
    return Chunk(chunk)


class DistinctLabels(beam.PTransform):
    """The label names of all media, each once (what the encoder's label ids are made from)."""

    def expand(self, media):
        return (media
                | "LabelsOf" >> beam.FlatMap(lambda chunk: {name for item in chunk for name in item.labels})
                | "Distinct" >> beam.Distinct())
