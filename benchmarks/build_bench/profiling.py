"""Where a profiled build's time went: per stage in the driver, per image in the encode workers.

Reads the cProfile stats job_child.py (driver.prof: the main thread, where Beam's in-process runner runs
every step) and hook/sitecustomize.py (worker-<pid>.prof: one per encode worker) wrote. Functions are
found by file and name, so the breakdown follows the job's code as long as those names stay.
"""
from __future__ import annotations

import glob
import os
import pstats
from dataclasses import dataclass

Key = tuple[str, int, str]


@dataclass(frozen=True)
class Fn:
    """A function in a profile: the end of its file path (or '~' for built-ins) and its name."""

    file: str
    name: str

    def matches(self, key: Key) -> bool:
        return key[2] == self.name and (key[0] == self.file if self.file == "~" else key[0].endswith(self.file))


def _t(module: str, name: str) -> Fn:
    return Fn(f"beam_jobs/{module}.py", name)


def _j(module: str, name: str) -> Fn:
    return Fn(f"beam_jobs/jobs/{module}.py", name)


def _s(module: str, name: str) -> Fn:
    return Fn(f"shard_utils/{module}.py", name)


RUN = _j("build", "run")
GRAPH = _j("build", "build_pipeline")
BEAM_RUN = Fn("apache_beam/pipeline.py", "run")
CHECKS = (_j("options", "parse"), _j("checks", "check_input"), _j("checks", "prepare_output"),
          _j("checks", "pipeline_options"))
AFTER = (Fn("shard_utils/format/manifest.py", "load"), _j("summary", "summary"), _j("summary", "metrics_summary"),
         _j("running", "raise_job_failure"))
LIST = (_t("pipeline/listing", "list_task"), _t("pipeline/listing", "classify_chunk"),
        _t("pipeline/listing", "_listed_chunk"))
ENCODE = (_t("pipeline/common", "process"), _t("pipeline/common", "finish_bundle"))
FLUSH = _t("pipeline/encode", "done")  # where a run's encoded result is taken in
PLAN = (_t("pipeline/plan_runs", "key_chunk"), _t("pipeline/plan_runs", "add_input"),
        _t("pipeline/plan_runs", "sample_sizes"), _t("pipeline/plan_runs", "layouts_or_failure"),
        _t("pipeline/plan_runs", "boundary_keys"), _t("pipeline/plan_runs", "pick_boundaries"),
        _t("pipeline/shards", "plan_shards"))
SLICES = _t("pipeline/encode", "assign_runs")
WRITE = (Fn("shard_utils/sharding/writer.py", "write_shard"),)
READ_RANGE = _s("storage/__init__", "read_range")
PUBLISH = (_t("pipeline/publish", "plan_step"), _t("pipeline/publish", "clear_step"),
           _t("pipeline/publish", "commit_step"), Fn("beam_jobs/publish/__init__.py", "merge_index"))
ENCODE_ITEM = _s("media/encode", "encode_item")
ENCODE_BATCH = Fn("shard_utils/sharding/encode_run.py", "encode_run")
RECEIVE, SEND = _t("local/wire", "receive"), _t("local/wire", "send")
PER_IMAGE = (
    ("read the file", (Fn("shard_utils/media/reads.py", "read_source"),), None),
    ("open + identify (header)", (_s("media/images", "_open"),), None),
    ("EXIF orientation (PNG: decoded here, Pillow seeks eXIf)", (_s("media/images", "_orientation"),), None),
    ("find JPEG end (marker walk)", (_s("media/images", "jpeg_primary_end"),), None),
    ("decode (full, or 1/8 to validate)", (_s("media/images", "_load"),), None),
    ("convert to RGB", (_s("media/images", "to_rgb"),), None),
    ("JPEG encode (Pillow save)", (Fn("PIL/Image.py", "save"),), _s("media/images", "_reencode")),
    ("sha256", (Fn("~", "<built-in method _hashlib.openssl_sha256>"),), ENCODE_ITEM),
    ("build the Example (encode_example)", (_s("format/schema", "encode_example"),), None),
    ("frame (CRC32C)", (_s("format/tfrecord", "frame"),), None),
    ("split + sort key", (_s("plan", "choose_split"), _s("plan", "sort_key")), ENCODE_ITEM),
)
# C-level work, wherever in the steps above it happens (own time of Pillow's codec calls).
CODECS = (
    ("  pixel decoding (ImagingDecoder.decode)", Fn("~", "<method 'decode' of 'ImagingDecoder' objects>")),
    ("  JPEG encoding (ImagingEncoder.encode)", Fn("~", "<method 'encode' of 'ImagingEncoder' objects>")),
)


def load(paths: list[str]) -> pstats.Stats | None:
    """The stats of these files merged; None when there are none."""
    stats = None
    for path in paths:
        stats = pstats.Stats(path) if stats is None else stats.add(path)
    return stats


def cum(stats: pstats.Stats, *fns: Fn, caller: Fn | None = None) -> float:
    """Cumulative seconds in these functions (only their calls from `caller`, when given)."""
    total = 0.0
    for key, (_, _, _, ct, callers) in stats.stats.items():
        if not any(fn.matches(key) for fn in fns):
            continue
        if caller is None:
            total += ct
        else:
            total += sum(v[3] for k, v in callers.items() if caller.matches(k))
    return total


def own(stats: pstats.Stats, fn: Fn) -> float:
    """Own (not cumulative) seconds of a function."""
    return sum(v[2] for k, v in stats.stats.items() if fn.matches(k))


def calls(stats: pstats.Stats, fn: Fn) -> int:
    return sum(v[1] for k, v in stats.stats.items() if fn.matches(k))


WAITS = ("acquire' of '_thread.lock", "select", "poll", "sleep", "waitpid")


def _where(key: Key) -> str:
    file, line, name = key
    return name if file == "~" else f"{'/'.join(file.split('/')[-2:])}:{line}({name})"


def top_functions(stats: pstats.Stats, n: int, base: pstats.Stats | None = None,
                  per: int = 1) -> list[tuple[float, float, str]]:
    """The n functions with the most own time (seconds, calls, where), waits on locks and pipes left out.
    With `base` (the tiny build's stats): the growth from base to stats divided by `per` (per image)."""
    before = base.stats if base is not None else {}
    rows = []
    for key, (_, nc, tt, _, _) in stats.stats.items():
        if key[0] == "~" and any(w in key[2] for w in WAITS):
            continue
        old = before.get(key, (0, 0, 0.0, 0.0, {}))
        rows.append(((tt - old[2]) / per, (nc - old[1]) / per, _where(key)))
    return sorted(rows, reverse=True)[:n]


def driver_rows(stats: pstats.Stats, wall: float) -> list[tuple[str, float]]:
    """(stage, seconds) of the driver's main thread; nested stages are indented by two spaces."""
    graph, beam_run = cum(stats, GRAPH), cum(stats, BEAM_RUN)
    checks, after = cum(stats, *CHECKS), cum(stats, *AFTER)
    flush, read = cum(stats, FLUSH), cum(stats, READ_RANGE)
    inner = [
        ("list (walk + classify)", cum(stats, *LIST)),
        ("encode: submit, wait for workers, take results", cum(stats, *ENCODE) - flush),
        ("  of which encode_item in this process (--workers 1)", cum(stats, ENCODE_ITEM)),
        ("runs taken in (results of the encode step)", flush),
        ("plan (tally, plan, boundary keys; or the listing's and the runs' plans)", cum(stats, *PLAN)),
        ("items assigned to runs", cum(stats, SLICES)),
        ("shard write: fragment or run reads (read_range)", read),
        ("shard write: merge or copy, write, index", cum(stats, *WRITE) - read),
        ("publish (checks, clear, commit, index merge)", cum(stats, *PUBLISH)),
    ]
    ours = sum(s for name, s in inner if not name.startswith("  "))
    rows = [("options, input and output checks, lock", checks), ("graph construction (build_pipeline)", graph),
            ("Beam run (Pipeline.run)", beam_run)]
    rows += [("  " + name, s) for name, s in inner]
    rows += [("  Beam itself (rest of Pipeline.run)", beam_run - ours),
             ("after the run (manifest, summary, counters)", after),
             ("other (start-up of run(), exit)", wall - checks - graph - beam_run - after)]
    return rows


def encode_rows(stats: pstats.Stats) -> tuple[int, list[tuple[str, float | None]]]:
    """(images, [(what, seconds)]) inside encode_item, in whichever process ran it."""
    images = calls(stats, ENCODE_ITEM)
    total = cum(stats, ENCODE_ITEM)
    rows = [(name, cum(stats, *fns, caller=caller)) for name, fns, caller in PER_IMAGE]
    rows.append(("other (records, dataclasses, rejections)", total - sum(s for _, s in rows)))
    codecs = [(name, own(stats, fn)) for name, fn in CODECS]
    heading = ("of which, in Pillow's C codecs (own time):", None)
    return images, [("encode_item, total", total), *rows, heading, *codecs]


def worker_rows(stats: pstats.Stats, workers: int) -> list[tuple[str, float]]:
    """How the encode workers' lifetimes split (seconds summed over workers)."""
    life = stats.total_tt
    busy = cum(stats, ENCODE_BATCH)
    idle = cum(stats, Fn("~", "<method 'read' of '_io.BufferedReader' objects>"), caller=RECEIVE)
    imports = cum(stats, Fn("<frozen importlib._bootstrap>", "_find_and_load"))
    send = cum(stats, SEND)
    return [(f"lifetime ({workers} workers summed)", life), ("  imports (start-up)", imports),
            ("  encoding runs (encode_run)", busy), ("  sending results (pickle + pipe)", send),
            ("  waiting for work (pipe read)", idle),
            ("  other (negative: imports inside the steps above)", life - imports - busy - send - idle)]


@dataclass(frozen=True)
class Profiled:
    """The stats of one profiled build: its folder, wall seconds and image count."""

    folder: str
    wall: float
    images: int

    @property
    def driver(self) -> pstats.Stats:
        return load([os.path.join(self.folder, "driver.prof")])

    @property
    def worker_files(self) -> list[str]:
        return sorted(glob.glob(os.path.join(self.folder, "worker-*.prof")))

    @property
    def pool(self) -> pstats.Stats | None:
        return load(self.worker_files)


def _stage_lines(heading: str, share: str, big: list[tuple[str, float]], total: float, images: int,
                 small: list[tuple[str, float]] | None, extra: int) -> list[str]:
    """Rows of stages: seconds, share of `total`, ms per image, and (with the tiny build) steady ms per image."""
    lines = [f"  {heading:58s}{'s':>8s}{share:>8s}{'ms/image':>10s}" + ("  steady ms/image" if small else "")]
    for i, (name, seconds) in enumerate(big):
        line = f"  {name:58s}{seconds:8.2f}{100 * seconds / total:7.1f}%{1e3 * seconds / images:10.2f}"
        if small:
            line += f"{1e3 * (seconds - small[i][1]) / extra:17.3f}"
        lines.append(line)
    return lines


def report(big: Profiled, title: str, tiny: Profiled | None = None, top: int = 15) -> str:
    """The printed breakdown of one profiled build; with the profiled tiny build, per-image steady costs
    (the difference between the two builds per extra image: start-up costs cancel out)."""
    extra = big.images - tiny.images if tiny else 0
    driver, pool = big.driver, big.pool
    lines = [f"where the time goes: {title}",
             f"  profiled: {big.images} images in {big.wall:.2f} s under cProfile"
             + (f"; the tiny build ({tiny.images} images, profiled too) in {tiny.wall:.2f} s; "
                "steady = (big - tiny) / extra images" if tiny else "")]
    lines += _stage_lines("driver process, main thread", "% wall", driver_rows(driver, big.wall), big.wall,
                          big.images, driver_rows(tiny.driver, tiny.wall) if tiny else None, extra)
    if pool is not None:
        rows = worker_rows(pool, len(big.worker_files))
        small = None
        if tiny and tiny.pool is not None:
            small = worker_rows(tiny.pool, len(tiny.worker_files))
        lines += _stage_lines("encode workers", "% life", rows, rows[0][1], big.images, small, extra)
    where = pool if pool is not None and calls(pool, ENCODE_ITEM) else driver
    count, rows = encode_rows(where)
    if count:
        busy = rows[0][1]
        lines.append(f"  {'per image, inside encode_item (' + ('workers' if where is pool else 'driver') + ')':58s}"
                     f"{'s':>8s}{'% item':>8s}{'ms/image':>10s}")
        for name, seconds in rows:
            if seconds is None:
                lines.append(f"  {name}")
                continue
            lines.append(f"  {name:58s}{seconds:8.2f}{100 * seconds / busy:7.1f}%{1e3 * seconds / count:10.3f}")
    tiny_pool = tiny.pool if tiny else None
    for label, stats, base in (("driver main thread", driver, tiny.driver if tiny else None),
                               ("encode workers", pool, tiny_pool)):
        if stats is None:
            continue
        if base is not None:
            lines.append(f"  top {top} functions by own time per extra image (big - tiny build), {label}:")
            for ms, nc, fn in top_functions(stats, top, base, extra):
                lines.append(f"    {1e3 * ms:8.3f} ms {nc:8.2f} calls  {fn}")
        else:
            lines.append(f"  top {top} functions by own time, {label}:")
            for tt, nc, fn in top_functions(stats, top):
                lines.append(f"    {tt:8.2f} s {nc:9.0f} calls  {fn}")
    return "\n".join(lines)
