"""The `tpu-shards` command line: build, verify, inspect, extract, reshard. Errors become one line and a non-zero
exit."""
from __future__ import annotations

import difflib
import sys
from collections.abc import Callable, Sequence
from typing import NamedTuple

from beam_jobs.errors import OneLineParser, UsageError, exit_now, guarded
from shard_utils.text import printable

__all__ = [
    "verify_command", "intact_line", "inspect_command", "check_inspect_options", "describe", "extract_command",
    "build_command", "reshard_command", "Command", "COMMANDS", "USAGE_LINE", "overview", "version_line",
    "unknown_command", "console", "main"
]


def verify_command(argv: Sequence[str] | None) -> None:
    from shard_utils.read.verify import verify

    ap = OneLineParser(prog="tpu-shards verify",
                                 description="Check a dataset against its manifest; exit 0 when intact, 1 otherwise.")
    ap.add_argument("dataset", help="dataset folder (local or gs://) or its manifest.json")
    ap.add_argument("--deep", action="store_true",
                    help="also parse every record, decode its JPEG and check its label (downloads gs:// shards)")
    args = ap.parse_args(argv)
    problems = verify(args.dataset, deep=args.deep)
    for line in problems:
        print(f"tpu-shards: {printable(line)}", file=sys.stderr)
    if problems:
        raise SystemExit(1)
    print(intact_line(args.dataset, args.deep))


def intact_line(dataset: str, deep: bool) -> str:
    """What verify found intact, counted: the records per split, the shard files and their bytes."""
    from beam_jobs.jobs.summary import counted
    from shard_utils.format.manifest import load

    m = load(dataset)
    files = [s for split in m.splits.values() for s in split.shards + (split.array_record_shards or [])]
    records = ", ".join(f"{name} {counted(split.num_records, 'record')}" for name, split in m.splits.items())
    how = ("every record read, decoded and checked" if deep else
           "sizes and checksums checked (--deep also decodes every record)")
    return (f"tpu-shards: {dataset} is intact: {records} in {counted(len(files), 'shard file')}, "
            f"{sum(s.num_bytes for s in files) / 1e6:.1f} MB; {how}")


def inspect_command(argv: Sequence[str] | None) -> None:
    from beam_jobs.jobs.summary import counted, formats_text, shard_noun, twins_line
    from shard_utils.format.manifest import load
    from shard_utils.format.topology import cores_x_hosts

    ap = OneLineParser(prog="tpu-shards inspect",
                       description="Summarise a dataset from its manifest; with --report, also write "
                                   "contact sheets, charts and an index.html to look at it.")
    ap.add_argument("dataset", help="dataset folder (local or gs://) or its manifest.json")
    ap.add_argument("--report", metavar="DIR", help="write the report into this local folder")
    ap.add_argument("--seed", type=int, help="with --report: seed of the records shown on the contact sheets")
    ap.add_argument("--max-records", type=int,
                    help="with --report: records read per split for the contact sheets and size chart (default 5000)")
    ap.add_argument("--croissant", action="store_true",
                    help="print the dataset's Croissant description (croissant.json), made from its manifest")
    ap.add_argument("--write-croissant", action="store_true",
                    help="write croissant.json and the README.md card beside the manifest (e.g. for a dataset built "
                         "before they existed)")
    args = ap.parse_args(argv)
    check_inspect_options(args)
    m = load(args.dataset)
    if args.croissant or args.write_croissant:
        return describe(m, args.croissant, args.write_croissant)
    print(f"{printable(m.location)}: {len(m.labels)} labels, image size {m.image_size or 'varies'}, "
          f"{cores_x_hosts(m.num_cores, m.num_hosts)}, {formats_text(m)}")
    for name, split in m.splits.items():
        unlabeled = "" if split.labeled else " (unlabeled)"
        print(f"  {name}: {counted(split.num_records, 'record')}{unlabeled}, "
              f"{counted(len(split.shards), shard_noun(m))}, {split.num_bytes / 1e6:.1f} MB")
        for line in twins_line(split.array_record_shards):
            print(line)
    print(f"  files seen {m.files_seen}, rejected {m.rejected['count']}, skipped {m.skipped['count']}")
    if args.report is None:
        return
    from shard_utils.read import report

    page = report.write_report(m, args.report, seed=args.seed or 0,
                               max_records=5000 if args.max_records is None else args.max_records)
    print(f"tpu-shards: report written to {printable(page)}")


def check_inspect_options(args) -> None:
    """Refuse inspect's options that would be ignored: the report's own without --report, --report beside the
    Croissant ones (which print or write instead of the summary)."""
    if args.report is None:
        for flag in ("seed", "max_records"):
            if getattr(args, flag) is not None:
                raise UsageError(f"--{flag.replace('_', '-')} is for the report; add --report DIR or drop it")
    elif args.croissant or args.write_croissant:
        given = "--croissant" if args.croissant else "--write-croissant"
        raise UsageError(f"{given} prints or writes the Croissant description instead of the summary and its report; "
                         "run --report on its own")
    if args.max_records is not None and args.max_records < 1:
        raise UsageError("--max-records must be at least 1")


def describe(m, show: bool, write: bool) -> None:
    """Print and/or write a dataset's croissant.json and card, from its manifest."""
    from shard_utils import storage
    from shard_utils.format import croissant
    from shard_utils.format.filenames import CARD_NAME, CROISSANT_NAME
    from shard_utils.read import card

    data = croissant.croissant_bytes(m)
    if show:
        sys.stdout.write(data.decode("utf-8"))
    if write:
        storage.write_bytes(storage.join(m.location, CROISSANT_NAME), data)
        storage.write_bytes(storage.join(m.location, CARD_NAME), card.card_bytes(m))
        print(f"tpu-shards: wrote {CROISSANT_NAME} and {CARD_NAME} in {m.location}", file=sys.stderr)


def extract_command(argv: Sequence[str] | None) -> None:
    from shard_utils.read.extract import ExtractError, extract

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
    print(printable(f"tpu-shards: extracted {records} to {done.folder}{renamed} (map: {done.map_path})"))


def build_command(argv: Sequence[str] | None) -> None:
    try:
        from beam_jobs.jobs.build import run
    except KeyboardInterrupt:
        raise KeyboardInterrupt("nothing was written") from None
    run(argv)


def reshard_command(argv: Sequence[str] | None) -> None:
    from beam_jobs.jobs.reshard import run

    run(argv)


class Command(NamedTuple):
    run: Callable[[Sequence[str] | None], object]
    summary: str  # one line for `tpu-shards --help`


COMMANDS = {
    "build": Command(build_command, "turn a folder, bucket or listing of images into balanced JPEG TFRecord "
                                    "shards and a manifest"),
    "verify": Command(verify_command, "check a dataset against its manifest (--deep: decode every record)"),
    "inspect": Command(inspect_command, "summarise a dataset (--report: contact sheets, charts, index.html)"),
    "extract": Command(extract_command, "write records back as image files"),
    "reshard": Command(reshard_command, "copy a dataset into shards for another TPU topology, without re-encoding"),
}
USAGE_LINE = f"usage: tpu-shards {{{','.join(COMMANDS)}}} ...  (tpu-shards --help lists the commands)"


def overview() -> str:
    """`tpu-shards --help`: the commands, one line each."""
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {command.summary}" for name, command in COMMANDS.items()]
    return "\n".join(["usage: tpu-shards COMMAND [options]   (tpu-shards COMMAND --help: its options; "
                      "tpu-shards --version)", "",
                      "commands:", *lines])


def version_line() -> str:
    """`tpu-shards --version`: the program and its version."""
    from shard_utils import __version__

    return f"tpu-shards {__version__}"


def unknown_command(name: str) -> str:
    """The one-line error for a command that does not exist, with the closest one."""
    hint = difflib.get_close_matches(name, list(COMMANDS), n=1, cutoff=0.5)
    return f"tpu-shards: error: unknown command {name}" + (f"; did you mean {hint[0]}?" if hint else
                                                          f" (commands: {', '.join(COMMANDS)})")


def console() -> None:
    """The `tpu-shards` program."""
    exit_now(main())


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print(USAGE_LINE, file=sys.stderr)
        return 2
    if argv[0] in ("-h", "--help"):
        print(overview())
        return 0
    if argv[0] in ("-V", "--version"):
        print(version_line())
        return 0
    if argv[0] not in COMMANDS:
        print(unknown_command(argv[0]), file=sys.stderr)
        return 2
    return guarded(COMMANDS[argv[0]].run, argv[1:])


if __name__ == "__main__":
    console()
