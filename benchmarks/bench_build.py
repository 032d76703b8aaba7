"""Build throughput, scaling and memory of the job against Pillow, a pass-through floor and TFDS, in one run.

    python benchmarks/bench_build.py [--count 4000] [--workers 1,2,4,8,16] [--repeat 1] [--work DIR]
    python benchmarks/bench_build.py --small 50000          # 10,000 and 50,000 64x64 images
    python benchmarks/bench_build.py --profile [--count N]  # where the time goes (re-encode and pass-through)

On photo-like ~400x400 images (generated once in a process pool, cached under --work):
1. re-encode (PNG in, --jpeg-quality 75): the job against the plain Pillow decode + JPEG-encode loop run with
   as many processes as the job has workers (files split evenly);
2. pass-through (JPEG in): the job (--validate decode and structure) against "the floor": read, validate by
   a 1/8-scale decode, sha256, build and frame the Example with the job's own code, write; and against the
   "balanced floor": the same plus the second pass any exactly balanced build needs (sorted runs, then each
   shard merged in key order, hashed and written durably);
   (both also time the job's own per-image step, encode_item, alone: the rest is the pipeline around it)
3. the peer: a TensorFlow Datasets GeneratorBasedBuilder over the same files, in one process;
4. scaling over --workers; 5. peak memory of the whole process tree at N and --big-factor x N images;
6. the cost per core (vCPU-hours per million images).
Every job and TFDS build runs in a fresh process that imports Beam (or TensorFlow) before its clock
starts. "steady" figures subtract the fixed start-up, measured on a build of --tiny images of the same
kind with the same process setup. CPU figures are user + system time of every process involved. The
machine may be shared: compare ratios within one run, not times across runs (--repeat R keeps the best
of R interleaved rounds).
"""
from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
import time
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # this checkout's code, then the build_bench package

from build_bench import profiling, sections  # noqa: E402
from build_bench.bench import JOB_PATHS, Bench, log  # noqa: E402
from build_bench.results import fmt, ratio, table, verdict  # noqa: E402

MAIN_PATHS = ("reencode", "decode", "structure")


def available_cores() -> int:
    from beam_jobs.jobs.options import available_cores as cores

    return cores()


def measure_main(bench: Bench) -> None:
    """Every measurement of the main mode; rounds interleave everything so that load hits all alike."""
    n, tiny = bench.n, bench.tiny
    if not bench.args.no_tfds:
        bench.check_tfds()
    for repeat in range(bench.args.repeat):
        log(f"round {repeat + 1} of {bench.args.repeat}")
        for w in bench.workers:
            bench.pillow(w, n)
            bench.floor(w, n)
            bench.floor(w, n, decode=False)
            bench.balanced_floor(w, n)
            bench.balanced_floor(w, n, decode=False)
            for path in MAIN_PATHS:
                bench.encode_alone(path, w, n)
                bench.job(path, w, tiny)
                bench.job(path, w, n)
        if not bench.args.no_tfds:
            for kind in ("png", "jpeg"):
                bench.tfds(kind, tiny)
                bench.tfds(kind, n)
    if bench.args.big_factor:
        for path in ("reencode", "decode"):
            bench.job(path, bench.all, n * bench.args.big_factor)


def run_small(bench: Bench, sizes: list[int]) -> str:
    """--small: 64x64 JPEGs through the whole job at each size, on all cores; time and memory."""
    all_w, tiny = bench.all, bench.tiny
    bench.input("small", sizes[-1])  # fills the cache once; the smaller inputs link to it
    for repeat in range(bench.args.repeat):
        log(f"round {repeat + 1} of {bench.args.repeat}")
        bench.job("small", all_w, tiny)
        for size in sizes:
            bench.job("small", all_w, size)
            bench.floor(all_w, size, kind="small")
    rows = []
    for size in sizes:
        key, t = ("job", "small", all_w), bench.board.get(("job", "small", all_w, size))
        rows.append([size, fmt(t.seconds, 2), fmt(size / t.seconds), fmt(bench.steady(key, size)),
                     fmt(bench.steady_cpu_ms(key, size), 3), fmt(t.peak_mb, 0), fmt(t.driver_mb, 0),
                     fmt(bench.rate(("floor", "small", all_w, size))),
                     fmt(bench.cpu_ms(("floor", "small", all_w, size)), 3)])
    first, last = (bench.board.get(("job", "small", all_w, s)).peak_mb for s in (sizes[0], sizes[-1]))
    r = ratio(last, first)
    return "\n".join([
        f"Small images: 64x64 JPEGs through the whole job, {all_w} workers, default 16 bits of hash buckets (the "
        f"multi-bucket ranking); fixed start-up {fmt(bench.fixed(('job', 'small', all_w)), 2)} s ({tiny} images)",
        table(["images", "seconds", "img/s", "steady img/s", "steady CPU ms/img", "peak tree MB", "driver peak MB",
               "floor img/s", "floor CPU ms/img"], rows),
        f"  memory at {sizes[-1]} / at {sizes[0]}: {fmt(r, 2)}x {verdict(r, 1.3, at_most=True)}",
    ])


def run_profile(bench: Bench, paths: list[str], count: int) -> str:
    """--profile: per path and worker count, unprofiled tiny + N builds and the encode step alone (for the
    real rates), then one build under cProfile (driver and workers) broken down by stage."""
    out = []
    for path in paths:
        for w in bench.workers:
            bench.job(path, w, bench.tiny)
            bench.job(path, w, count)
            bench.encode_alone(path, w, count)
            profiled = {}
            for size in (bench.tiny, count):
                folder = bench.work / "profile" / f"{path}-{size}-w{w}"
                result = bench.job(path, w, size, profile=folder)
                profiled[size] = profiling.Profiled(str(folder), result["seconds"], size)
            key = ("job", path, w)
            steady_ms = 1e3 * w / bench.steady(key, count)
            title = "\n  ".join([
                f"{JOB_PATHS[path][2]}, --workers {w}",
                f"not profiled: fixed start-up {bench.fixed(key):.2f} s (a build of {bench.tiny}); {count} images in "
                f"{bench.seconds((*key, count)):.2f} s; steady {fmt(bench.steady(key, count))} img/s = "
                f"{fmt(steady_ms, 2)} ms per image and core",
                f"CPU per image (steady, all processes) {fmt(bench.steady_cpu_ms(key, count), 2)} ms, of which the "
                f"job's encode_item alone {fmt(bench.cpu_ms(('encode', path, w, count)), 2)} ms",
            ])
            out.append(profiling.report(profiled[count], title, tiny=profiled[bench.tiny]))
    out.append("  (cProfile slows Python code much more than C code (decoders, encoders): read shares, not rates)")
    return "\n\n".join(out)


def header(bench: Bench, argv: list[str], mode: str) -> str:
    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "absent"

    load = os.getloadavg()
    return "\n".join([
        f"tpu-shards build benchmark ({mode})",
        f"command: {shlex.join(['python', 'benchmarks/bench_build.py', *argv])}",
        f"machine: {bench.cores} cores in this process's CPU affinity ({os.cpu_count()} online), {platform.machine()}, "
        f"Linux {platform.release()}; load average at start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
        f"software: Python {platform.python_version()}, Pillow {version('Pillow')}, apache-beam "
        f"{version('apache-beam')}, tensorflow-datasets {version('tensorflow-datasets')}, "
        f"tensorflow {version('tensorflow-cpu')}",
        f"all cores = {bench.all} workers/processes; worker counts: {','.join(map(str, bench.workers))}; "
        f"best of {bench.args.repeat} round(s)",
    ])


def count_list(text: str) -> list[int]:
    """A comma-separated list of positive counts (argparse type)."""
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        values = []
    if not values or values[0] < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of positive counts")
    return values


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=4000, help="images per measured build (default 4000)")
    ap.add_argument("--workers", type=count_list,
                    help="worker counts, e.g. 1,2,4,8,16 (default 1 and all cores; 1 and all cores are always "
                         "measured; with --profile or --small: exactly these, default all cores)")
    ap.add_argument("--tiny", type=int, default=16, help="images of the build that measures the fixed start-up")
    ap.add_argument("--big-factor", type=int, default=4, help="memory run at this many times --count (0: skip)")
    ap.add_argument("--repeat", type=int, default=1, help="rounds of every measurement; the best time is kept")
    ap.add_argument("--no-tfds", action="store_true", help="skip the TensorFlow Datasets peer")
    ap.add_argument("--small", type=count_list,
                    help="small-image mode: COUNT (builds COUNT/5 and COUNT images) or a comma-separated list")
    ap.add_argument("--profile", nargs="?", const="reencode,decode",
                    help="profile mode: where the time goes, for these paths (default reencode,decode; choices "
                         "reencode, decode, structure); with --small: the small build at its largest count")
    ap.add_argument("--work", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "tpu-shards-bench"),
                    help="generated images (cached between runs), outputs and logs (default /tmp/tpu-shards-bench)")
    args = ap.parse_args(argv)
    if args.tiny < 1 or args.count <= args.tiny:
        ap.error("--count must be more than --tiny, and --tiny at least 1")
    if args.repeat < 1 or args.big_factor < 0:
        ap.error("--repeat must be at least 1 and --big-factor at least 0")
    if args.small and len(args.small) == 1:
        args.small = [max(args.tiny + 1, args.small[0] // 5), args.small[0]]
    if args.small and args.small[0] <= args.tiny:
        ap.error("--small counts must be more than --tiny")
    if args.profile and not args.small:
        unknown = set(args.profile.split(",")) - set(MAIN_PATHS)
        if unknown:
            ap.error(f"--profile: unknown path(s) {', '.join(sorted(unknown))}; choose from {', '.join(MAIN_PATHS)}")
    return args


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    cores = available_cores()
    focused = bool(args.profile or args.small)
    workers = sorted(set(args.workers or [cores]) | (set() if focused else {1, cores}))
    bench = Bench(args, cores, workers)
    mode = "profile" if args.profile else "small images" if args.small else "main"
    started = time.perf_counter()
    out = [header(bench, argv, mode)]
    if args.profile:
        paths = ["small"] if args.small else args.profile.split(",")
        out.append(run_profile(bench, paths, args.small[-1] if args.small else args.count))
    elif args.small:
        out.append(run_small(bench, args.small))
    else:
        measure_main(bench)
        out += [sections.reencode(bench), sections.passthrough(bench), sections.tfds(bench),
                sections.scaling(bench), sections.memory(bench), sections.cost(bench)]
    load = os.getloadavg()
    out.append(f"done in {time.perf_counter() - started:.0f} s; load average at the end {load[0]:.2f} {load[1]:.2f} "
               f"{load[2]:.2f} (on {cores} cores); logs under {bench.runs.logs}")
    print("\n\n".join(out))


if __name__ == "__main__":
    main()
