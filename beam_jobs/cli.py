"""The `tpu-shards` command line: build, verify, inspect. Errors become one line and a non-zero exit."""
from __future__ import annotations

import logging
import os
import re
import sys
import traceback
from typing import Callable, Sequence

from shard_utils.listing_files import ListingError
from shard_utils.manifest import ManifestError
from shard_utils.plan import PlanError
from shard_utils.storage import StorageError

from .errors import OneLineParser, UsageError


KNOWN = (UsageError, PlanError, ManifestError, StorageError, ListingError)
_WRAPPED = re.compile(r"\b(?:UsageError|PlanError|ManifestError|StorageError|NotFoundError|ListingError): (.+)")


def user_message(exc: BaseException) -> str | None:
    """The one-line message of a known error, even when a Beam runner wrapped it."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, KNOWN):
            return str(exc).split(" [while running")[0].strip().splitlines()[0]
        match = _WRAPPED.search(str(exc))
        if match:
            return match.group(1).split(" [while running")[0].strip()
        exc = exc.__cause__ or exc.__context__
    return None


def guarded(fn: Callable[[Sequence[str] | None], object], argv: Sequence[str] | None) -> int:
    """Run a command; known errors print one line and exit 1 (2 for usage), anything else exits 3."""
    if not os.environ.get("TPU_SHARDS_DEBUG"):
        # Beam's local runner logs a failing step's whole traceback; the one line printed below says it better.
        for name in ("apache_beam.runners.common", "apache_beam.runners.worker", "apache_beam.runners.portability"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        fn(argv)
        return 0
    except KeyboardInterrupt as exc:  # a command may say what state it left (KeyboardInterrupt("..."))
        print("tpu-shards: interrupted" + (f"; {exc.args[0]}" if exc.args else ""), file=sys.stderr)
        return 130
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    except Exception as exc:  # noqa: BLE001 - the CLI's job is to turn errors into one line
        message = user_message(exc)
        if message is not None:
            print(f"tpu-shards: error: {message}", file=sys.stderr)
            return 2 if isinstance(exc, UsageError) else 1
        if os.environ.get("TPU_SHARDS_DEBUG"):
            traceback.print_exc()
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        print(f"tpu-shards: internal error: {type(exc).__name__}: {first} (set TPU_SHARDS_DEBUG=1 for details)",
              file=sys.stderr)
        return 3


def verify_command(argv: Sequence[str] | None) -> None:
    from shard_utils.verify import verify

    ap = OneLineParser(prog="tpu-shards verify",
                                 description="Check a dataset against its manifest; exit 0 when intact, 1 otherwise.")
    ap.add_argument("dataset", help="dataset folder (local or gs://) or its manifest.json")
    ap.add_argument("--deep", action="store_true",
                    help="also parse every record, decode its JPEG and check its label (downloads gs:// shards)")
    args = ap.parse_args(argv)
    problems = verify(args.dataset, deep=args.deep)
    for line in problems:
        print(f"tpu-shards: {line}", file=sys.stderr)
    if problems:
        raise SystemExit(1)
    print(f"tpu-shards: {args.dataset} is intact")


def inspect_command(argv: Sequence[str] | None) -> None:
    from shard_utils.manifest import load

    ap = OneLineParser(prog="tpu-shards inspect",
                       description="Summarise a dataset from its manifest; with --report, also write "
                                   "contact sheets, charts and an index.html to look at it.")
    ap.add_argument("dataset", help="dataset folder (local or gs://) or its manifest.json")
    ap.add_argument("--report", metavar="DIR", help="write the report into this local folder")
    ap.add_argument("--seed", type=int, default=0, help="seed of the records shown on the contact sheets")
    ap.add_argument("--max-records", type=int, default=5000,
                    help="records read per split for the contact sheets and size chart (default 5000)")
    args = ap.parse_args(argv)
    m = load(args.dataset)
    print(f"{m.location}: {len(m.labels)} labels, image size {m.image_size or 'varies'}, "
          f"{m.num_cores} cores x {m.num_hosts} hosts")
    for name, split in m.splits.items():
        print(f"  {name}: {split.num_records} records, {len(split.shards)} shards, {split.num_bytes / 1e6:.1f} MB")
    print(f"  files seen {m.files_seen}, rejected {m.rejected['count']}, skipped {m.skipped['count']}")
    if args.report is None:
        return
    from shard_utils import report
    from shard_utils.extras import MissingExtra

    if args.max_records < 1:
        raise UsageError("--max-records must be at least 1")
    try:
        page = report.write_report(m, args.report, seed=args.seed, max_records=args.max_records)
    except MissingExtra as exc:
        raise UsageError(str(exc)) from None
    print(f"tpu-shards: report written to {page}")


def extract_command(argv: Sequence[str] | None) -> None:
    from shard_utils.extract import ExtractError, extract

    ap = OneLineParser(prog="tpu-shards extract",
                       description="Write records back as files, DIR/<split>/<label>/<source file name>, holding "
                                   "exactly the stored JPEG bytes (video: a folder of frames). Names are sanitised; "
                                   "DIR/extract_map.csv maps records to files.")
    ap.add_argument("dataset", help="dataset folder (local or gs://) or its manifest.json")
    ap.add_argument("dir", help="a new or empty local folder")
    ap.add_argument("--split", help="only this split")
    ap.add_argument("--label", help="only records with this label")
    ap.add_argument("--limit", type=int, help="at most this many records")
    ap.add_argument("--source-id", help="only the record with this source id")
    args = ap.parse_args(argv)
    try:
        done = extract(args.dataset, args.dir, split=args.split, label=args.label, limit=args.limit,
                       source_id=args.source_id)
    except ExtractError as exc:
        raise UsageError(str(exc)) from None
    renamed = f"; {done.renamed} renamed to stay safe and unique" if done.renamed else ""
    records = f"{done.count} record{'' if done.count == 1 else 's'}"
    print(f"tpu-shards: extracted {records} to {done.folder}{renamed} (map: {done.map_path})")


def build_command(argv: Sequence[str] | None) -> None:
    try:
        from .build_shards import run
    except KeyboardInterrupt:
        raise KeyboardInterrupt("nothing was written") from None
    run(argv)


def reshard_command(argv: Sequence[str] | None) -> None:
    from .reshard import run

    run(argv)


COMMANDS = {"build": build_command, "verify": verify_command, "inspect": inspect_command,
            "extract": extract_command, "reshard": reshard_command}


def exit_now(code: int) -> None:
    """End the process with `code` once the command is done: output flushed, no interpreter teardown.

    Beam's runner leaves threads that the interpreter's shutdown can wait on (and a Ctrl-C landing during
    that shutdown would kill the process without a word); everything the command wrote is complete here.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def console() -> None:
    """The `tpu-shards` program."""
    exit_now(main())


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        print("usage: tpu-shards {build,verify,inspect,extract,reshard} ...  (tpu-shards COMMAND --help for options)",
              file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    return guarded(COMMANDS[argv[0]], argv[1:])


if __name__ == "__main__":
    console()
