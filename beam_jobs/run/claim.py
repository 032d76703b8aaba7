"""The run's claim on its output: the lock taken, what the job keeps there between runs, where its temporary
data lives, and the clearing up at each end of a run (only while the run holds the lock, so no other run can
be working on what is removed)."""
from __future__ import annotations

import hashlib

from beam_jobs.errors import UsageError
from beam_jobs.run.identity import RunInfo
from shard_utils import storage
from shard_utils.format import shard_formats
from shard_utils.format.filenames import (
    CARD_NAME,
    CROISSANT_NAME,
    INDEX_FILE,
    LOCK_NAME,
    QUALITY_NAME,
    REPORT_FILE,
    TEMP_ROOT,
    TFDS_LABELS_BEFORE,
)
from shard_utils.format.manifest import MANIFEST_NAME, REJECTED_NAME, SKIPPED_NAME, ManifestError, load
from shard_utils.read import tfds_meta
from shard_utils.storage import lock as runlock
from shard_utils.storage.lock import LEASE_SECONDS

__all__ = ["OWN_NAMES", "DATASET_FILES", "TEMP_ROOT", "take", "output_content", "temp_root_for", "clear_leftovers",
           "let_go", "clean_stale_runs", "remove_unfinished_writes", "remove_orphaned_files", "remove_run_folder",
           "is_dataset_file", "published_by"]

OWN_NAMES = (TEMP_ROOT + "/", LOCK_NAME)  # what the job itself keeps in an output between builds
# Files of a published dataset besides shards and indexes: removed before a new one is published.
DATASET_FILES = (REJECTED_NAME, SKIPPED_NAME, QUALITY_NAME, tfds_meta.DATASET_INFO, tfds_meta.FEATURES,
                 tfds_meta.LABELS, TFDS_LABELS_BEFORE, CROISSANT_NAME, CARD_NAME)


def take(output: str, run_id: str, created: str, lease_seconds: float = LEASE_SECONDS) -> None:
    """Take the output's lock for this run (again: the run already holds it); UsageError when another run
    holds it. Other storage errors are the caller's to word."""
    try:
        runlock.acquire(output, run_id, created, lease_seconds)
    except runlock.OutputBusy as exc:
        raise UsageError(str(exc)) from None


def output_content(output: str) -> list[str]:
    """What an output folder holds besides the job's own bookkeeping (temporary folders, the lock)."""
    return [n for n in storage.list_names(output) if n not in OWN_NAMES]


def temp_root_for(output: str, temp_location: str | None) -> str:
    """Where runs keep temporary data: under --temp_location when it is on the same kind of storage as the
    output (e.g. a bucket without soft delete), else in a hidden folder of the output."""
    if temp_location and storage.is_gcs(temp_location) == storage.is_gcs(output):
        return storage.join(temp_location, "tpu-shards", hashlib.sha256(output.rstrip("/").encode()).hexdigest()[:16])
    return storage.join(output, TEMP_ROOT)


def clear_leftovers(output: str, temp_root: str, run_id: str) -> None:
    """Once the lock is this run's: remove what dead earlier runs left (their temporary folders, and their
    unfinished writes beside the dataset's files)."""
    clean_stale_runs(temp_root, run_id)
    remove_unfinished_writes(output)


def let_go(output: str, temp_root: str, run: RunInfo) -> None:
    """A run done with the output: its temporary folder removed, the lock given back."""
    remove_run_folder(temp_root, run.temp_dir)
    runlock.release(output, run.run_id)


def clean_stale_runs(temp_root: str, run_id: str) -> None:
    """Remove temporary folders of earlier runs into this output (only while this run holds the lock,
    so none of them can still be working)."""
    for name in storage.list_names(temp_root):
        if name.rstrip("/") != run_id:
            try:
                storage.delete_prefix(storage.join(temp_root, name.rstrip("/")))
            except storage.StorageError:
                pass  # tried again by the next run


def remove_unfinished_writes(output: str) -> None:
    """Remove the temporary files a killed run left beside the dataset's own files (only while this run holds
    the lock, so no other run can be writing them)."""
    ours = {MANIFEST_NAME, LOCK_NAME, *DATASET_FILES}
    for temp, name in storage.unfinished_writes(output):
        if name in ours or is_dataset_file(name):
            try:
                storage.delete(storage.join(output, temp))
            except storage.StorageError:
                pass  # tried again by the next run


def remove_orphaned_files(output: str) -> None:
    """After a failed run that holds the lock: when the output has no manifest (the run removed it, then failed
    before writing its own), remove the dataset files left there, so the output is empty, not a dataset without
    its contract. With a manifest (an append, or a run that failed before it touched the output), nothing."""
    names = storage.list_names(output)
    if MANIFEST_NAME in names:
        return
    for name in names:
        if is_dataset_file(name) or name in DATASET_FILES:
            try:
                storage.delete(storage.join(output, name))
            except storage.StorageError:
                pass  # the next run into this output removes it (clear_output)


def remove_run_folder(temp_root: str, temp_dir: str) -> None:
    """Remove a finished run's temporary folder, and the folder of runs if nothing else is left in it."""
    try:
        storage.delete_prefix(temp_dir)
        if not storage.list_names(temp_root):
            storage.delete_prefix(temp_root)
    except storage.StorageError:
        pass  # hidden leftovers; the next run into this output removes them


def is_dataset_file(name: str) -> bool:
    """Whether a name in a dataset folder is one of the job's shards, indexes or reports."""
    return bool(shard_formats.of_shard(name) or INDEX_FILE.match(name)
                or REPORT_FILE.match(name)
                or name in (REJECTED_NAME, SKIPPED_NAME, QUALITY_NAME))


def published_by(output: str, run: RunInfo) -> bool:
    """Whether the dataset in `output` is the one this run published (a retried step then has nothing to do)."""
    try:
        return load(output).created == run.created
    except (ManifestError, storage.StorageError):
        return False
