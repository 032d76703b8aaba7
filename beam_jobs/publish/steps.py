"""The publishing steps, each safe to run twice or twice at once: clear the output, move the shards in, write
each split's index, and commit (reports, metadata, the manifest last; the run's temporary data removed and the
lock given back)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from beam_jobs.errors import UsageError
from beam_jobs.publish.assembly import described_files, named_files, with_indexes
from beam_jobs.publish.index_file import write_index_file
from beam_jobs.publish.plan import IndexJob, Move, Publication, plan_publication
from beam_jobs.run.claim import DATASET_FILES, is_dataset_file, let_go, published_by
from beam_jobs.run.config import BuildConfig, RunSettings
from beam_jobs.run.identity import RunInfo
from beam_jobs.run.reports import PIECES_FOLDER, write_report
from shard_utils import storage
from shard_utils.errors import InternalError
from shard_utils.format.manifest import MANIFEST_NAME, IndexFile, Manifest, ManifestError, load, parse
from shard_utils.sharding.writer import ShardResult
from shard_utils.storage import lock as runlock

__all__ = ["clear_output", "move_shard", "merge_index", "commit", "finish", "publish_here"]


def clear_output(pub: Publication, config: RunSettings) -> None:
    """Before any shard moves in: a build removes the old manifest, then every dataset file it will not write
    again; an append removes only leftovers of an interrupted earlier append (the old manifest and its files
    stay). Nothing when this run has already published."""
    out = config.output
    if published_by(out, pub.run):
        return
    if not runlock.holds(out, pub.run.run_id):
        raise UsageError(f"output {out}: this run lost its lock to another run (its lease ran out); nothing was "
                         "published")
    keep = pub.new_names
    if pub.grows is None:
        storage.delete(storage.join(out, MANIFEST_NAME))
    else:
        try:
            current = load(out)
        except ManifestError as exc:
            raise UsageError(f"the dataset at {out} cannot be read any more ({exc}); nothing was published") from None
        if current.created != pub.grows.created:
            raise UsageError(f"the dataset at {out} changed while this append ran; nothing was published")
        keep = keep | named_files(pub.grows)
    for name in storage.list_names(out):
        if (is_dataset_file(name) or (pub.grows is None and name in DATASET_FILES)) and name not in keep:
            storage.delete(storage.join(out, name))


def move_shard(move: Move, config: RunSettings) -> str:
    """Move one shard into the output (a retry, or a second attempt at once, finds it moved)."""
    storage.rename(move.temp, storage.join(config.output, move.name), size=move.size)
    return move.name


def merge_index(job: IndexJob, config: RunSettings, run: RunInfo) -> tuple[str, IndexFile]:
    """Write one split's index into the output; (split, its manifest entry). Safe to repeat: the same parts give
    the same bytes, and once the run has published, its entry is read back from the manifest."""
    try:
        return job.split, write_index_file(job, config.output)
    except storage.NotFoundError:
        if published_by(config.output, run):
            found = load(config.output).splits[job.split].index
            if found is not None:
                return job.split, found
        raise


def commit(pub: Publication, config: RunSettings, indexes: Mapping[str, IndexFile]) -> str:
    """Write the reports and the manifest (last: the switch), then remove the run's temporary data and give the
    lock back; returns the manifest's path. Safe to repeat."""
    out = config.output
    path = storage.join(out, MANIFEST_NAME)
    if not published_by(out, pub.run):
        manifest = with_indexes(pub.manifest, indexes)
        text = manifest.to_json()  # made once: with a million labels each copy is a second
        try:
            parse(text, out)  # the loader's own checks, before anything is published
        except ManifestError as exc:
            raise InternalError(f"the manifest to publish does not validate: {exc}") from None
        if reports_published(pub, out):
            switch(pub, manifest, out, text)
    let_go(out, config.temp_root, pub.run)
    return path


def switch(pub: Publication, manifest: Manifest, out: str, text: str) -> None:
    """The manifest written (TFDS's files, croissant.json and the card before it for a build, after it for an
    append, with the files only the old manifest named removed); `text`: the manifest's JSON."""
    if pub.grows is None:
        for name, data in described_files(manifest, out).items():
            storage.write_bytes(storage.join(out, name), data)
    storage.write_bytes(storage.join(out, MANIFEST_NAME), text.encode("utf-8"))
    if pub.grows is not None:  # the old dataset's TFDS view and the files only it named go now
        for name, data in described_files(manifest, out).items():
            storage.write_bytes(storage.join(out, name), data)
        for name in sorted(named_files(pub.grows) - named_files(manifest)):
            storage.delete(storage.join(out, name))


def reports_published(pub: Publication, out: str) -> bool:
    """Each report composed in the run's temporary folder (beside its pieces), then copied into the output; False
    when another attempt at once published the run meanwhile (and removed the pieces)."""
    for name, report in pub.reports:
        temp = storage.join(pub.run.temp_dir, "report", name)
        try:
            write_report(report, temp, storage.join(pub.run.temp_dir, PIECES_FOLDER))
            storage.copy(temp, storage.join(out, name))
        except storage.NotFoundError:
            if published_by(out, pub.run):
                return False
            raise
    return True


def finish(results: Sequence[ShardResult], config: BuildConfig, **kw) -> str:
    """Every publishing step in turn, here (what the Publish step runs in parallel)."""
    pub = plan_publication(results, config, **kw)
    return publish_here(pub, config)


def publish_here(pub: Publication, config: RunSettings) -> str:
    """Run a publication's steps one after another in this process."""
    clear_output(pub, config)
    for move in pub.moves:
        move_shard(move, config)
    indexes = dict(merge_index(job, config, pub.run) for job in pub.indexes)
    return commit(pub, config, indexes)
