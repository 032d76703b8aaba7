"""A run that cannot publish: one line saying why (the top rejection reasons with an example each, the skips,
where the full lists are), and its reports left in the run's temporary folder for the user to read."""
from __future__ import annotations

from collections.abc import Sequence

from beam_jobs.run.reports import PIECES_FOLDER, Report, as_report, write_report
from beam_jobs.run.tally import Tally
from shard_utils import storage
from shard_utils.errors import PlanError
from shard_utils.format.manifest import REJECTED_NAME, SKIPPED_NAME
from shard_utils.text import printable

__all__ = ["FAILURE_METRIC", "REPORTED_REASONS", "failure_message", "write_reports", "failed"]

FAILURE_METRIC = "failure"  # a local build that cannot publish says why in this Beam metric (see pipeline.publish)
REPORTED_REASONS = 3  # reasons named in a failure's one line


def failure_message(why: str, rejected: Report | Sequence[dict], tally: Tally, report: str) -> str:
    """One line: why nothing was published, the top rejection reasons with an example each, and where
    the full lists are (from the counts alone)."""
    parts = [why]
    counts = as_report(rejected).counts
    if counts.by_reason:
        shown = [printable(f"{n} {reason} (e.g. {_example(counts.example(reason))})")
                 for reason, n in counts.by_reason.most_common(REPORTED_REASONS)]
        more = len(counts.by_reason) - REPORTED_REASONS
        parts.append("rejected: " + ", ".join(shown) + (f" and {more} more reasons" if more > 0 else ""))
    skipped = sum(tally.skipped.values())
    if skipped:
        exts = ", ".join(f"{printable(ext)} {n}" for ext, n in tally.extensions.most_common(5))
        parts.append(f"skipped {skipped} ({', '.join(f'{k} {v}' for k, v in tally.skipped.most_common())}"
                     + (f"; not media: {exts}" if exts else "") + ")")
    if counts.count or skipped:
        parts.append(f"skipped files are listed beside {storage.join(report, REJECTED_NAME)}" if not counts.count
                     else f"every rejected file is listed with its reason in {storage.join(report, REJECTED_NAME)}")
    return "; ".join(parts)


def _example(entry: dict) -> str:
    return f"{entry['source']}: {entry['message']}"


def write_reports(folder: str, rejected: Report, skipped_files: Report) -> None:
    """rejected.jsonl and skipped.jsonl, sorted, in a folder of the run's (nothing when there is nothing to
    report)."""
    if not len(rejected) and not len(skipped_files):
        return
    scratch = storage.join(storage.parent(folder), PIECES_FOLDER)
    write_report(rejected, storage.join(folder, REJECTED_NAME), scratch)
    write_report(skipped_files, storage.join(folder, SKIPPED_NAME), scratch)


def failed(why: str, temp_dir: str, rejected: Report, skipped_files: Report, tally: Tally) -> PlanError:
    """The error of a run that cannot publish, its reports written first under `<temp_dir>/report` (for the
    caller to raise)."""
    report = storage.join(temp_dir, "report")
    write_reports(report, rejected, skipped_files)
    return PlanError(failure_message(why, rejected, tally, report))
