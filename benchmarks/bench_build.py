"""Build throughput, scaling and memory of the job against Pillow, a pass-through floor and TFDS, in one run.

    python benchmarks/bench_build.py [--count 4000] [--workers 1,2,4,8,16] [--repeat 1] [--work DIR]
    python benchmarks/bench_build.py --small 50000          # 10,000 and 50,000 64x64 images
    python benchmarks/bench_build.py --profile [--count N]  # where the time goes (re-encode and pass-through)

On photo-like ~400x400 images (generated once in a process pool, cached under --work):
1. re-encode (PNG in, --jpeg-quality 75): the job against the plain Pillow decode + JPEG-encode loop run with
   as many processes as the job has workers (files split evenly);
2. pass-through (JPEG in): the job (--validate decode and structure) against "the floor": read, validate by
   a 1/8-scale decode, sha256, build and frame the Example with the job's own code, write;
3. the peer: a TensorFlow Datasets GeneratorBasedBuilder over the same files, in one process;
4. scaling over --workers; 5. peak memory of the whole process tree at N and --big-factor x N images.
Every job and TFDS build runs in a fresh process that imports Beam (or TensorFlow) before its clock
starts. "steady" rates subtract the fixed start-up, measured on a build of --tiny images of the same kind
with the same process setup. The machine may be shared: compare ratios within one run, not absolute
times across runs (--repeat R keeps the best of R interleaved runs of everything).
"""
from __future__ import annotations

import argparse
import math
import os
import platform
import shlex
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # this checkout's code, then the build_bench package

from build_bench import baselines, data, profiling  # noqa: E402
from build_bench.runner import Runs  # noqa: E402

JOB_PATHS = {  # name: (image kind, job flags, what it is)
    "reencode": ("png", ("--jpeg-quality", "75"), "re-encode: PNG in, JPEG q75 out"),
    "decode": ("jpg", (), "pass-through: JPEG in, --validate decode (default)"),
    "structure": ("jpg", ("--validate", "structure"), "pass-through: JPEG in, --validate structure"),
}
SMALL_PATH = ("small", (), "pass-through: 64x64 JPEGs, --validate decode")


def log(message: str) -> None:
    """Progress goes to stderr; the report (stdout) stays copy-pasteable."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def available_cores() -> int:
    from beam_jobs.options import available_cores as cores  # what the job's default --workers counts

    return cores()


# --------------------------------------------------------------------------------------------- results


@dataclass
class Timing:
    seconds: float  # the best of the repeats
    peak_mb: float = 0.0  # the largest process-tree peak seen
    driver_mb: float = 0.0


class Board:
    """Measurements by key; repeats keep the best time and the largest memory."""

    def __init__(self) -> None:
        self.entries: dict[tuple, Timing] = {}

    def add(self, key: tuple, seconds: float, peak_mb: float = 0.0, driver_mb: float = 0.0) -> None:
        old = self.entries.get(key)
        if old is None:
            self.entries[key] = Timing(seconds, peak_mb, driver_mb)
        else:
            self.entries[key] = Timing(min(old.seconds, seconds), max(old.peak_mb, peak_mb),
                                       max(old.driver_mb, driver_mb))

    def add_result(self, key: tuple, result: dict) -> None:
        self.add(key, result["seconds"], result.get("peak_tree_mb", 0.0), result.get("driver_peak_mb", 0.0))

    def get(self, key: tuple) -> Timing | None:
        return self.entries.get(key)

    def seconds(self, key: tuple) -> float:
        found = self.entries.get(key)
        return found.seconds if found else math.nan


def steady_rate(n: int, tiny: int, seconds: float, tiny_seconds: float) -> float:
    """Images/s without the fixed start-up: (n - tiny) / (t(n) - t(tiny))."""
    if not seconds > tiny_seconds:
        return math.nan
    return (n - tiny) / (seconds - tiny_seconds)


def ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(b) else math.nan


def verdict(value: float, target: float, at_most: bool = False) -> str:
    if math.isnan(value):
        return "n/a"
    ok = value <= target if at_most else value >= target
    return f"{'MET' if ok else 'MISSED'} (target {'<=' if at_most else '>='} {target:g})"


def fmt(value: float, digits: int = 1) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def table(headers: list[str], rows: list[list[str]], indent: str = "  ") -> str:
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    lines = []
    for row in [headers, *rows]:
        cells = [str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(row, widths))]
        lines.append(indent + "  ".join(cells).rstrip())
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------- measuring


class Bench:
    """One benchmark run: its options, inputs, the measurements and the runs that make them."""

    def __init__(self, args: argparse.Namespace, cores: int, workers: list[int]):
        self.args, self.cores, self.workers = args, cores, workers
        self.cores_used = cores if cores in workers else workers[-1]  # "all cores" in the comparisons
        self.tfds_check: dict[str, dict] = {}
        self.work = Path(args.work).resolve()
        self.runs = Runs(self.work)
        self.board = Board()
        self.inputs: dict[tuple[str, int], Path] = {}
        self.mb: dict[tuple[str, int], float] = {}

    def input(self, kind: str, count: int) -> Path:
        if (kind, count) not in self.inputs:
            start = time.perf_counter()
            folder = data.input_folder(self.work, kind, count, self.cores)
            self.inputs[kind, count] = folder
            self.mb[kind, count] = data.source_bytes(folder) / 1e6
            log(f"input {kind} x {count}: {folder} ({self.mb[kind, count]:.0f} MB, ready in "
                f"{time.perf_counter() - start:.1f} s)")
        return self.inputs[kind, count]

    def job(self, path: str, workers: int, count: int, profile: Path | None = None) -> dict:
        kind, flags, _ = JOB_PATHS.get(path, SMALL_PATH)
        log(f"job {path} x {count}, --workers {workers}{' (profiled)' if profile else ''}")
        label = f"{path}-{count}-w{workers}" + ("-profiled" if profile else "")
        result = self.runs.job(label, self.input(kind, count), workers, *flags, profile=profile)
        if profile is None:
            self.board.add_result(("job", path, workers, count), result)
        return result

    def pillow(self, workers: int, count: int) -> None:
        log(f"Pillow loop x {count}, {workers} processes")
        self.board.add(("pillow", workers, count), baselines.time_pillow(self.input("png", count), workers, 75))

    def floor(self, workers: int, count: int, kind: str = "jpg", decode: bool = True) -> None:
        log(f"pass-through floor x {count}, {workers} processes{'' if decode else ', no decode'}")
        seconds = baselines.time_floor(self.input(kind, count), workers, self.work / "floor-out", decode)
        self.board.add(("floor" if decode else "floor-nodecode", kind, workers, count), seconds)

    def encode_alone(self, path: str, workers: int, count: int) -> None:
        kind, flags, _ = JOB_PATHS.get(path, SMALL_PATH)
        quality = 75 if path == "reencode" else 95
        validate = "structure" if path == "structure" else "decode"
        log(f"the job's encode_batch alone, {path} x {count}, {workers} processes")
        seconds = baselines.time_job_encode(self.input(kind, count), workers, quality, validate)
        self.board.add(("encode", path, workers, count), seconds)

    def tfds(self, kind: str, count: int) -> None:
        log(f"TFDS builder {kind} x {count}")
        source = self.input("png" if kind == "png" else "jpg", count)
        self.board.add_result(("tfds", kind, count), self.runs.tfds(f"{kind}-{count}", kind, source))

    def steady(self, key: tuple, count: int) -> float:
        """The steady rate of a job/TFDS measurement at `count` images (key without the count)."""
        tiny = self.args.tiny
        return steady_rate(count, tiny, self.board.seconds((*key, count)), self.board.seconds((*key, tiny)))

    def rate(self, key: tuple) -> float:
        return key[-1] / self.board.seconds(key)

    def marginal(self, key: tuple, low: int, high: int) -> float:
        """Images/s between two sizes of the same build: (high - low) / (t(high) - t(low)); less noisy than
        the steady rate when the fixed start-up is a large part of the smaller build."""
        return steady_rate(high, low, self.board.seconds((*key, high)), self.board.seconds((*key, low)))


def worker_counts(text: str | None, cores: int, always: tuple[int, ...]) -> list[int]:
    values = {cores} if text is None else set()
    for part in (text or "").split(","):
        if part.strip():
            value = int(part)
            if value < 1:
                raise SystemExit("--workers: counts must be at least 1")
            values.add(value)
    return sorted(values | set(always))


def measure_main(bench: Bench) -> None:
    args, n, tiny = bench.args, bench.args.count, bench.args.tiny
    if not args.no_tfds:
        for kind in ("jpeg", "png"):
            log(f"checking what TFDS does with {kind} input")
            source = bench.input("png" if kind == "png" else "jpg", tiny)
            bench.tfds_check[kind] = bench.runs.tfds(f"check-{kind}", kind, source, check=True)
    for repeat in range(args.repeat):
        log(f"round {repeat + 1} of {args.repeat}")
        for w in bench.workers:
            bench.pillow(w, n)
            bench.floor(w, n)
            bench.floor(w, n, decode=False)
            for path in JOB_PATHS:
                bench.encode_alone(path, w, n)
                bench.job(path, w, tiny)
                bench.job(path, w, n)
        if not args.no_tfds:
            for kind in ("png", "jpeg"):
                bench.tfds(kind, tiny)
                bench.tfds(kind, n)
    if args.big_factor:
        for path in ("reencode", "decode"):
            bench.job(path, bench.cores_used, n * args.big_factor)


# --------------------------------------------------------------------------------------------- report


def header(bench: Bench, argv: list[str]) -> str:
    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "absent"

    load = os.getloadavg()
    return "\n".join([
        "tpu-shards build benchmark",
        f"command: {shlex.join([sys.executable.split('/')[-1], 'benchmarks/bench_build.py', *argv])}",
        f"machine: {bench.cores} cores in this process's CPU affinity ({os.cpu_count()} online), "
        f"{platform.machine()}, Linux {platform.release()}; load average at start {load[0]:.2f} {load[1]:.2f} "
        f"{load[2]:.2f}",
        f"software: Python {platform.python_version()}, Pillow {version('Pillow')}, apache-beam "
        f"{version('apache-beam')}, tensorflow-datasets {version('tensorflow-datasets')}, "
        f"tensorflow {version('tensorflow-cpu')}",
        f"all cores = {bench.cores_used} workers/processes"
        + ("" if bench.args.small else f"; worker counts measured: {','.join(map(str, bench.workers))}")
        + f"; best of {bench.args.repeat} round(s)",
    ])


def section_reencode(bench: Bench) -> str:
    n, tiny, b, all_w = bench.args.count, bench.args.tiny, bench.board, bench.cores_used
    rows = []
    for w in sorted({1, all_w}):
        pillow = bench.rate(("pillow", w, n))
        rows.append([f"Pillow loop (decode + encode q75), {w} proc", w, fmt(b.seconds(("pillow", w, n)), 2),
                     fmt(pillow), "", "", ""])
    for w in sorted({1, all_w}):
        key = ("encode", "reencode", w, n)
        rows.append([f"job's encode_batch alone (no Beam), {w} proc", w, fmt(b.seconds(key), 2), fmt(bench.rate(key)),
                     "", "", ""])
    for w in sorted({1, all_w}):
        key = ("job", "reencode", w)
        rows.append([f"job --workers {w}", w, fmt(b.seconds((*key, n)), 2), fmt(bench.rate((*key, n))),
                     fmt(bench.steady(key, n)), fmt(b.seconds((*key, tiny)), 2), fmt(b.get((*key, n)).peak_mb, 0)])
    lines = [f"1. Re-encode path: {n} PNG -> JPEG q75 (~400x400, {bench.mb['png', n]:.0f} MB of PNG)",
             table(["", "procs", "seconds", "img/s", "steady img/s", "fixed s", "peak tree MB"], rows)]
    for w in sorted({1, all_w}):
        key, pillow = ("job", "reencode", w), bench.rate(("pillow", w, n))
        e2e, steady = ratio(bench.rate((*key, n)), pillow), ratio(bench.steady(key, n), pillow)
        targets = (f"  {verdict(e2e, 0.7)} / {verdict(steady, 0.8)}" if w == all_w else "")
        lines.append(f"  job / Pillow loop, {w} process(es): end to end {fmt(e2e, 2)}x, steady {fmt(steady, 2)}x"
                     + targets)
    lines += overhead_lines(bench, ("reencode",))
    if bench.args.big_factor:
        big = n * bench.args.big_factor
        marginal = bench.marginal(("job", "reencode", all_w), n, big)
        r = ratio(marginal, bench.rate(("pillow", all_w, n)))
        lines.append(f"  job --workers {all_w}, marginal {n} -> {big} images: {fmt(marginal)} img/s = {fmt(r, 2)}x "
                     f"the Pillow loop with {all_w} processes")
    return "\n".join(lines)


def section_passthrough(bench: Bench) -> str:
    n, tiny, b, all_w = bench.args.count, bench.args.tiny, bench.board, bench.cores_used
    rows = []
    for name, label in (("floor", "floor (read, 1/8 decode, sha256, Example, frame, write)"),
                        ("floor-nodecode", "floor without the decode (for --validate structure)")):
        for w in sorted({1, all_w}):
            key = (name, "jpg", w, n)
            rows.append([f"{label}, {w} proc", w, fmt(b.seconds(key), 2), fmt(bench.rate(key)), "", "", ""])
    for path in ("decode", "structure"):
        for w in sorted({1, all_w}):
            key = ("encode", path, w, n)
            rows.append([f"job's encode_batch alone (no Beam), {path}, {w} proc", w, fmt(b.seconds(key), 2),
                         fmt(bench.rate(key)), "", "", ""])
    for path in ("decode", "structure"):
        for w in sorted({1, all_w}):
            key = ("job", path, w)
            rows.append([f"job --validate {path} --workers {w}", w, fmt(b.seconds((*key, n)), 2),
                         fmt(bench.rate((*key, n))), fmt(bench.steady(key, n)), fmt(b.seconds((*key, tiny)), 2),
                         fmt(b.get((*key, n)).peak_mb, 0)])
    lines = [f"2. Pass-through path: {n} JPEGs (~400x400 q90, {bench.mb['jpg', n]:.0f} MB)",
             table(["", "procs", "seconds", "img/s", "steady img/s", "fixed s", "peak tree MB"], rows)]
    for path, floor in (("decode", "floor"), ("structure", "floor-nodecode")):
        for w in sorted({1, all_w}):
            steady = bench.steady(("job", path, w), n)
            r = ratio(steady, bench.rate((floor, "jpg", w, n)))
            lines.append(f"  job --validate {path} steady / {floor}, {w} process(es): {fmt(r, 2)}x  "
                         + (verdict(r, 0.8) if path == "decode" else "(no target)"))
    if bench.args.big_factor:
        big = n * bench.args.big_factor
        marginal = bench.marginal(("job", "decode", all_w), n, big)
        r = ratio(marginal, bench.rate(("floor", "jpg", all_w, n)))
        lines.append(f"  job --validate decode, {all_w} workers, marginal {n} -> {big} images: {fmt(marginal)} img/s "
                     f"= {fmt(r, 2)}x the floor with {all_w} processes  {verdict(r, 0.8)}")
    if all_w > 1:
        job = ratio(bench.steady(("job", "decode", all_w), n), bench.steady(("job", "decode", 1), n))
        floor = ratio(bench.rate(("floor", "jpg", all_w, n)), bench.rate(("floor", "jpg", 1, n)))
        lines.append(f"  scaling 1 -> {all_w}: job (steady) {fmt(job, 2)}x, floor {fmt(floor, 2)}x; "
                     f"job scaling / floor scaling {fmt(ratio(job, floor), 2)}")
    lines += overhead_lines(bench, ("decode", "structure"))
    return "\n".join(lines)


def overhead_lines(bench: Bench, paths: tuple[str, ...]) -> list[str]:
    """Per image, the job's steady time minus its encode step alone: what Beam, pipes, fragments and shards cost."""
    n, out = bench.args.count, []
    for path in paths:
        for w in sorted({1, bench.cores_used}):
            job_ms = 1e3 * w / bench.steady(("job", path, w), n)
            alone_ms = 1e3 * w / bench.rate(("encode", path, w, n))
            out.append(f"  {path}, {w} worker(s): per image and core, job steady {fmt(job_ms, 2)} ms = encode_batch "
                       f"{fmt(alone_ms, 2)} ms + around it {fmt(job_ms - alone_ms, 2)} ms")
    return out


def section_tfds(bench: Bench) -> str:
    n, tiny, b, all_w = bench.args.count, bench.args.tiny, bench.board, bench.cores_used
    if bench.args.no_tfds:
        return "3. TFDS: skipped (--no-tfds)"
    rows = []
    for kind, path, label in (("png", "reencode", "PNG -> JPEG q75"), ("jpeg", "structure", "JPEG kept")):
        key = ("tfds", kind)
        rows.append([f"TFDS builder, {label}, 1 process", fmt(b.seconds((*key, n)), 2), fmt(bench.rate((*key, n))),
                     fmt(bench.steady(key, n)), fmt(b.seconds((*key, tiny)), 2), fmt(b.get((*key, n)).peak_mb, 0)])
        jkey = ("job", path, all_w)
        flags = " ".join(JOB_PATHS[path][1])
        rows.append([f"job {flags}, {all_w} workers", fmt(b.seconds((*jkey, n)), 2), fmt(bench.rate((*jkey, n))),
                     fmt(bench.steady(jkey, n)), fmt(b.seconds((*jkey, tiny)), 2),
                     fmt(b.get((*jkey, n)).peak_mb, 0)])
    lines = [f"3. The peer: TensorFlow Datasets GeneratorBasedBuilder.download_and_prepare(), same {n} files",
             table(["", "seconds", "img/s", "steady img/s", "fixed s", "peak tree MB"], rows)]
    for kind, path, target in (("png", "reencode", 1.5), ("jpeg", "structure", 1.0)):
        e2e = ratio(bench.rate(("job", path, all_w, n)), bench.rate(("tfds", kind, n)))
        steady = ratio(bench.steady(("job", path, all_w), n), bench.steady(("tfds", kind), n))
        lines.append(f"  job / TFDS, {'re-encode' if kind == 'png' else 'pass-through (--validate structure)'}: "
                     f"end to end {fmt(e2e, 2)}x {verdict(e2e, target)}, steady {fmt(steady, 2)}x")
    check = bench.tfds_check
    if check:
        jpeg, png = check["jpeg"], check["png"]
        lines.append(f"  TFDS checked on {jpeg['records']} JPEGs: stored bytes identical to the files: "
                     f"{jpeg['bytes_unchanged']}; image decodes during the build: "
                     f"{sum(jpeg['decode_calls'].values())} (so TFDS neither decodes nor validates JPEGs)")
        lines.append(f"  TFDS checked on {png['records']} PNGs: stored as JPEG: {png['all_jpeg']}; bytes identical "
                     f"to Pillow's save(quality=75) (what the job writes at --jpeg-quality 75): "
                     f"{png['equals_pillow_q75']}; Pillow decodes seen: {sum(png['decode_calls'].values())} "
                     "(the profile does see decodes)")
    return "\n".join(lines)


def section_scaling(bench: Bench) -> str:
    n, b = bench.args.count, bench.board
    rows = []
    for w in bench.workers:
        row = [str(w)]
        for path in JOB_PATHS:
            row += [fmt(bench.rate(("job", path, w, n))), fmt(bench.steady(("job", path, w), n))]
        row += [fmt(bench.rate(("pillow", w, n))), fmt(bench.rate(("floor", "jpg", w, n)))]
        row += [fmt(max(b.get(("job", p, w, n)).peak_mb for p in JOB_PATHS), 0)]
        rows.append(row)
    lines = [f"4. Scaling ({n} images; img/s end to end / steady)",
             table(["workers", "re-encode", "steady", "decode", "steady", "structure", "steady", "Pillow", "floor",
                    "peak tree MB"], rows)]
    low, high = bench.workers[0], bench.workers[-1]
    if high > low:
        for path in JOB_PATHS:
            e2e = ratio(bench.rate(("job", path, high, n)), bench.rate(("job", path, low, n)))
            steady = ratio(bench.steady(("job", path, high), n), bench.steady(("job", path, low), n))
            target = f"  {verdict(steady, 1.7)} on 2 cores" if (low, high) == (1, 2) else ""
            lines.append(f"  job {path}: {high} / {low} workers: end to end {fmt(e2e, 2)}x, steady {fmt(steady, 2)}x"
                         + target)
        for name, key in (("Pillow loop", lambda w: ("pillow", w, n)), ("floor", lambda w: ("floor", "jpg", w, n))):
            scaled = ratio(bench.rate(key(high)), bench.rate(key(low)))
            lines.append(f"  {name}: {high} / {low} processes: {fmt(scaled, 2)}x")
    return "\n".join(lines)


def section_memory(bench: Bench) -> str:
    n, b, all_w, factor = bench.args.count, bench.board, bench.cores_used, bench.args.big_factor
    lines = [f"5. Memory: peak RSS of the whole process tree (driver + encode workers, polled every 50 ms)"]
    if factor:
        rows = []
        for path in ("reencode", "decode"):
            small, big = b.get(("job", path, all_w, n)), b.get(("job", path, all_w, n * factor))
            r = ratio(big.peak_mb, small.peak_mb)
            rows.append([f"job {path}, {all_w} workers", fmt(small.peak_mb, 0), fmt(big.peak_mb, 0), fmt(r, 2),
                         verdict(r, 1.3, at_most=True), fmt(bench.rate(("job", path, all_w, n * factor))),
                         fmt(bench.marginal(("job", path, all_w), n, n * factor))])
        lines.append(table(["", f"MB at {n}", f"MB at {n * factor}", "ratio", "", f"img/s at {n * factor}",
                            f"marginal img/s {n} -> {n * factor}"], rows))
    if len(bench.workers) > 1:
        low = bench.workers[0]
        rows = []
        for w in bench.workers:
            peaks = [b.get(("job", p, w, n)).peak_mb for p in ("reencode", "decode")]
            base = [b.get(("job", p, low, n)).peak_mb for p in ("reencode", "decode")]
            rows.append([str(w), fmt(peaks[0], 0), fmt(ratio(peaks[0], base[0]), 2), fmt(peaks[1], 0),
                         fmt(ratio(peaks[1], base[1]), 2), fmt(w / low, 2)])
        lines.append(table(["workers", "re-encode MB", "x", "pass-through MB", "x", f"workers / {low} (linear)"],
                           rows))
    return "\n".join(lines)


def section_cost(bench: Bench) -> str:
    n, all_w = bench.args.count, bench.cores_used
    rows = []
    for path in JOB_PATHS:
        for w in sorted({1, all_w}):
            for how, value in (("steady", bench.steady(("job", path, w), n)),
                               ("end to end", bench.rate(("job", path, w, n)))):
                per_core = value / w
                rows.append([f"{path}, {w} worker(s), {how}", fmt(per_core), fmt(1e6 / per_core / 3600, 2)])
    return "\n".join(["6. Cost: images/s per core (per vCPU) and vCPU-hours per million images "
                      "(= 1e6 / (img/s per vCPU) / 3600)",
                      table(["", "img/s per core", "vCPU-h per 1M"], rows)])


# --------------------------------------------------------------------------------------------- modes


def small_sizes(text: str, tiny: int) -> list[int]:
    """--small COUNT: COUNT/5 and COUNT (memory is compared between them); or the listed counts."""
    values = sorted({int(v) for v in text.split(",") if v.strip()})
    if len(values) == 1:
        values = [max(tiny + 1, values[0] // 5), values[0]]
    return values


def run_small(bench: Bench, sizes: list[int]) -> str:
    args, all_w, tiny = bench.args, bench.cores_used, bench.args.tiny
    bench.input("small", sizes[-1])  # fills the cache once; smaller sizes link to it
    for repeat in range(args.repeat):
        log(f"round {repeat + 1} of {args.repeat}")
        bench.job("small", all_w, tiny)
        for size in sizes:
            bench.job("small", all_w, size)
            bench.floor(all_w, size, kind="small")
    rows = []
    for size in sizes:
        t = bench.board.get(("job", "small", all_w, size))
        rows.append([str(size), fmt(t.seconds, 2), fmt(size / t.seconds), fmt(bench.steady(("job", "small", all_w),
                                                                                            size)),
                     fmt(t.peak_mb, 0), fmt(t.driver_mb, 0), fmt(bench.rate(("floor", "small", all_w, size)))])
    first, last = (bench.board.get(("job", "small", all_w, s)) for s in (sizes[0], sizes[-1]))
    r = ratio(last.peak_mb, first.peak_mb)
    return "\n".join([
        f"Small images: 64x64 JPEGs through the whole job ({all_w} workers; 16-bit hash buckets: the multi-bucket "
        f"ranking); fixed start-up {fmt(bench.board.seconds(('job', 'small', all_w, tiny)), 2)} s ({tiny} images)",
        table(["images", "seconds", "img/s", "steady img/s", "peak tree MB", "driver peak MB", "floor img/s"], rows),
        f"  memory at {sizes[-1]} / at {sizes[0]}: {fmt(r, 2)}x {verdict(r, 1.3, at_most=True)}",
    ])


def run_profile(bench: Bench, paths: list[str], sizes: list[int] | None) -> str:
    out = []
    for path in paths:
        count = sizes[-1] if path == "small" else bench.args.count
        for w in bench.workers:
            tiny = bench.args.tiny
            bench.job(path, w, tiny)
            bench.job(path, w, count)
            bench.encode_alone(path, w, count)
            folder = bench.work / "profile" / f"{path}-{count}-w{w}"
            result = bench.job(path, w, count, profile=folder)
            kind_label = JOB_PATHS[path][2] if path in JOB_PATHS else SMALL_PATH[2]
            fixed = bench.board.seconds(("job", path, w, tiny))
            steady, alone = bench.steady(("job", path, w), count), bench.rate(("encode", path, w, count))
            title = (f"{kind_label}, --workers {w}\n  not profiled: fixed start-up {fixed:.2f} s (build of {tiny}); "
                     f"{count} images in {bench.board.seconds(('job', path, w, count)):.2f} s, steady {fmt(steady)} "
                     f"img/s = {fmt(1e3 * w / steady, 2)} ms per image and core, of which the job's encode_batch "
                     f"alone {fmt(1e3 * w / alone, 2)} ms ({fmt(alone)} img/s with {w} processes)")
            out.append(profiling.report(str(folder), result["seconds"], count, title))
    out.append("  (cProfile slows Python code much more than C code (decoders, encoders): read shares, not rates)")
    return "\n\n".join(out)


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=4000, help="images per measured build (default 4000)")
    ap.add_argument("--workers", help="comma-separated worker counts, e.g. 1,2,4,8,16 (default 1 and all cores; "
                                      "1 and all cores are always measured; with --profile: exactly these, "
                                      "default all cores)")
    ap.add_argument("--tiny", type=int, default=16, help="images of the build that measures the fixed start-up")
    ap.add_argument("--big-factor", type=int, default=4, help="memory run at this many times --count (0: skip)")
    ap.add_argument("--repeat", type=int, default=1, help="rounds of every measurement; the best time is kept")
    ap.add_argument("--no-tfds", action="store_true", help="skip the TensorFlow Datasets peer")
    ap.add_argument("--small", help="small-image mode: COUNT (runs COUNT/5 and COUNT) or a comma-separated list")
    ap.add_argument("--profile", nargs="?", const="reencode,decode",
                    help="profile mode: where the time goes, for these paths (default reencode,decode; "
                         "choices reencode, decode, structure; with --small: the small build)")
    ap.add_argument("--work", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "tpu-shards-bench"),
                    help="generated images (cached between runs), outputs and logs (default /tmp/tpu-shards-bench)")
    args = ap.parse_args(argv)
    if args.count <= args.tiny or args.tiny < 1:
        ap.error("--count must be more than --tiny, and --tiny at least 1")
    if args.profile:
        unknown = set(args.profile.split(",")) - set(JOB_PATHS)
        if unknown and not args.small:
            ap.error(f"--profile: unknown path(s) {', '.join(sorted(unknown))}; choose from {', '.join(JOB_PATHS)}")
    return args


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    cores = available_cores()
    profiling_mode = bool(args.profile)
    always = () if profiling_mode else (1, cores)
    workers = worker_counts(args.workers, cores, always)
    bench = Bench(args, cores, workers)
    started = time.perf_counter()
    out = [header(bench, argv)]
    sizes = small_sizes(args.small, args.tiny) if args.small else None
    if profiling_mode:
        paths = ["small"] if sizes else args.profile.split(",")
        out.append(run_profile(bench, paths, sizes))
    elif sizes:
        out.append(run_small(bench, sizes))
    else:
        measure_main(bench)
        out += [section_reencode(bench), section_passthrough(bench), section_tfds(bench), section_scaling(bench),
                section_memory(bench), section_cost(bench)]
    load = os.getloadavg()
    out.append(f"done in {time.perf_counter() - started:.0f} s; load average at the end {load[0]:.2f} {load[1]:.2f} "
               f"{load[2]:.2f} (on {cores} cores); logs under {bench.runs.logs}")
    print("\n\n".join(out))


if __name__ == "__main__":
    main()
