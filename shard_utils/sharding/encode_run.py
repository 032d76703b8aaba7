"""Encoding one run: its listed items, in key order, read (several at once from gs://), encoded and written
into one run file. No Beam: the build's encode step runs it inline or in local worker processes."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from shard_utils import storage
from shard_utils.errors import InternalError
from shard_utils.format.order import sort_key
from shard_utils.inputs import MediaItem
from shard_utils.media.encode import Encoded, EncodeSettings, Prepared, encode_data, unlabeled_reject
from shard_utils.media.reads import needs_prefetch, prefetched, read_source
from shard_utils.sharding.runs import CHUNK_BYTES, RunFile, RunWriter
from shard_utils.storage.throttle import Waited

__all__ = ["Embed", "EMBED_BATCH", "PARTS_FOLDER", "RunTask", "EncodeTally", "EncodedRun", "item_order", "encode_run",
           "read_items", "weigh_sample"]

Embed = Callable[[list[Prepared]], list]  # prepared records -> framed records (Encoded) or rejections, in order
EMBED_BATCH = 32  # prepared records handed to the model at a time, when no batch size is given
PARTS_FOLDER = "run-parts"  # under a build's temporary folder: the parts of runs encoded in parts (run_parts)


@dataclass(frozen=True)
class RunTask:
    """The listed items of one run of a split (any order: they are sorted here), or of one part of it."""

    split: str
    run: int
    items: Sequence[MediaItem]
    part: int | None = None  # the part of the run these items are (`run_parts`); None: the whole run


@dataclass(frozen=True)
class EncodeTally:
    """What a run's encoding made, for the build's counters and progress."""

    records: int = 0
    passed_through: int = 0
    trailers: int = 0
    trailer_bytes: int = 0
    throttled_s: float = 0.0  # reads held back by the throttle or backing off after 429/503
    read_retries: int = 0
    signed: int = 0  # records with a perceptual signature (none: the run has nothing for near-duplicates)


@dataclass(frozen=True)
class EncodedRun:
    """A run once encoded: its file (None when every item was rejected), its rejections and its tally."""

    split: str
    run: int
    file: RunFile | None
    rejected: tuple[dict, ...]
    tally: EncodeTally
    quality: tuple[dict, ...] = ()  # the findings of its images' flags (shard_utils.quality.findings)


def item_order(item: MediaItem, seed: int) -> tuple[int, str]:
    """An item's place in its split's order: what its record's sort key and source id will be."""
    return sort_key(seed, item.source_id), item.source_id


def encode_run(task: RunTask, settings: EncodeSettings, folder: str, *, embed: Embed | None = None,
               embed_batch: int = EMBED_BATCH, chunk_bytes: int = CHUNK_BYTES) -> EncodedRun:
    """Encode the run's items in key order into its run file under `folder` (a build's temporary folder).

    Raises TransientReadError when a source could not be read for a reason that may pass: the run is then
    encoded again as a whole, into the same names, and no item is rejected for it."""
    items = sorted(task.items, key=lambda item: item_order(item, settings.seed))
    writer = RunWriter(_folder(folder, task.part), task.split, task.run, chunk_bytes)
    rejected: list[dict] = []
    quality: list[dict] = []
    records = passed = trailers = trailer_bytes = signed = 0
    waited = Waited()
    try:
        for outcome in _outcomes(items, settings, embed, embed_batch, waited):
            if isinstance(outcome, dict):
                rejected.append(outcome)
                continue
            if outcome.split != task.split:
                raise InternalError(f"run {task.run} of split {task.split!r} got a record of split "
                                         f"{outcome.split!r} ({outcome.meta.source_id})")
            writer.add(outcome.framed, outcome.meta)
            quality.extend(outcome.quality)
            records += 1
            passed += outcome.passed_through
            trailers += bool(outcome.trailer_bytes)
            trailer_bytes += outcome.trailer_bytes
            signed += bool(outcome.meta.phash)
        written = writer.close()
    except BaseException:
        writer.abort()
        raise
    return EncodedRun(task.split, task.run, written, tuple(rejected),
                      EncodeTally(records, passed, trailers, trailer_bytes, waited.seconds, waited.retries, signed),
                      tuple(quality))


def _folder(folder: str, part: int | None) -> str:
    """Where a run, or a part of one, is written under a build's temporary folder."""
    return folder if part is None else storage.join(folder, PARTS_FOLDER, f"{part:03d}")


def _outcomes(items: Sequence[MediaItem], settings: EncodeSettings, embed: Embed | None,
              embed_batch: int, waited: Waited) -> Iterator[Encoded | dict]:
    """Every item's outcome in order: a framed record or a rejection (records embedded in batches first)."""
    encoded = (encode_data(item, settings, data) for item, data in read_items(items, settings, waited))
    if settings.frame_now:
        for outcome in encoded:
            if isinstance(outcome, Prepared):
                raise InternalError("a record waits for an embedding, but records are framed as they are encoded")
            yield outcome
        return
    if embed is None:
        raise InternalError("records wait for an embedding, but no model was given")
    waiting: list = []  # rejections keep their place among the prepared records
    for outcome in encoded:
        waiting.append(outcome)
        if sum(isinstance(w, Prepared) for w in waiting) >= embed_batch:
            yield from _embedded(waiting, embed)
            waiting = []
    yield from _embedded(waiting, embed)


def _embedded(outcomes: list, embed: Embed) -> Iterable[Encoded | dict]:
    prepared = [o for o in outcomes if isinstance(o, Prepared)]
    done = iter(embed(prepared) if prepared else [])
    for o in outcomes:
        yield next(done) if isinstance(o, Prepared) else o


def read_items(items: Sequence[MediaItem], settings: EncodeSettings, waited: Waited | None = None):
    """(item, bytes or Unusable) in order: remote sources read ahead while earlier ones are encoded; `waited`
    adds up their time held back by throttling."""
    def read(item: MediaItem):
        if unlabeled_reject(item, settings) is not None:
            return b""  # rejected without being read
        return read_source(item.uri, settings.max_file_bytes, item.size, waited)

    if any(needs_prefetch(item.uri) for item in items):
        return prefetched(items, read, lambda item: item.size)
    return ((item, read(item)) for item in items)


def weigh_sample(items: Sequence[MediaItem], settings: EncodeSettings) -> tuple[int, int, int]:
    """(source bytes, framed record bytes, records) of the items that encode into records (rejected ones are left
    out): what the plan's size sample weighs, in whichever process encodes it."""
    source = record = records = 0
    for item, data in read_items(items, settings):
        outcome = encode_data(item, settings, data)
        if isinstance(outcome, Encoded):
            source += len(data)
            record += outcome.meta.length
            records += 1
    return source, record, records
