"""tpu-shards against the writers a user would pick instead, on the same photo-like JPEGs, side by side.

    python benchmarks/bench_peers.py --peers-python /work/peers-venv/bin/python [--kind jpg|phone]
        [--count 4000] [--tiny 64] [--rounds 3] [--workers 2] [--modes pass,decode,reencode]
        [--peers webdataset,tfds,mds,litdata] [--tpu-shards-args '...'] [--work DIR] [--json FILE]

The peers (webdataset's `ShardWriter`, a TFDS `GeneratorBasedBuilder`, MosaicML streaming's `MDSWriter`,
litdata's `optimize`: benchmarks/peers_bench/child.py) live in an environment of their own, their pins clash
with the project's; benchmarks/peers-requirements.txt says how to make it. tpu-shards runs with this Python.
Each tool does the same work per image in each mode (benchmarks/peers_bench/work.py): pass-through (tpu-shards
`--validate structure`), the decode check (`--validate decode`: every byte decoded at 1/8 scale), re-encode to
224x224 at quality 75 (`--image-size 224 --jpeg-quality 75`), with --workers processes where the tool has them.
Every run is a whole fresh process; rounds alternate the order of the tools. Printed: medians over the rounds of
the wall, the CPU of the process and all it waited for, the peak of the summed resident memory of its whole
process tree, each tool's fixed cost (the same run on --tiny images) and CPU per image with it subtracted, and
tpu-shards' ratios to each peer. A run whose output lacks a record fails the benchmark (exit 1); a peer that
cannot be imported with --peers-python is reported missing and left out.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

from build_bench import data  # noqa: E402
from peers_bench import outputs  # noqa: E402
from peers_bench.child import MISSING, TOOLS  # noqa: E402
from peers_bench.measure import Run, timed  # noqa: E402
from peers_bench.report import table  # noqa: E402
from peers_bench.work import MODES, QUALITY, SIDE  # noqa: E402

MODE_ARGS = {"pass": ["--validate", "structure"], "decode": ["--validate", "decode"],
             "reencode": ["--image-size", str(SIDE), "--jpeg-quality", str(QUALITY)]}
KINDS = ("jpg", "phone")  # build_bench.data's ~400x400 photo-like JPEGs, and phone-size ones (1200 x 1312-1600)
TIMEOUT = 1800.0  # seconds one run may take before it is killed and counted failed
OURS = {"tpu-shards": [], "no-checks": ["--quality-checks", "off"]}  # our columns: the default build, and without
# the quality checks (signatures, flags, near-duplicates), which no peer does


def listed(choices: tuple[str, ...]):
    """An argparse type: a comma-separated subset of choices, in the order given."""
    def parse(text: str) -> list[str]:
        values = [v.strip() for v in text.split(",") if v.strip()]
        unknown = sorted(set(values) - set(choices))
        if unknown or not values:
            raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(choices)}")
        return list(dict.fromkeys(values))
    return parse


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peers-python", default=sys.executable,
                    help="the Python of the peers' environment (default: this one, where most peers are missing)")
    ap.add_argument("--kind", default="jpg", choices=KINDS, help="jpg: ~400x400; phone: 1600x1200-ish (default jpg)")
    ap.add_argument("--count", type=int, default=4000, help="images of the measured runs (default 4000)")
    ap.add_argument("--tiny", type=int, default=64, help="images of the runs that measure the fixed cost (default 64)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds; medians are reported (default 3)")
    ap.add_argument("--workers", type=int, default=2, help="processes of each tool that has workers (default 2)")
    ap.add_argument("--modes", type=listed(MODES), default=list(MODES), help="default: pass,decode,reencode")
    ap.add_argument("--peers", type=listed(TOOLS), default=list(TOOLS), help="default: " + ",".join(TOOLS))
    ap.add_argument("--tpu-shards-args", default="", help="more options for every tpu-shards build, as one string")
    ap.add_argument("--checks-off", action="store_true",
                    help="also run tpu-shards with --quality-checks off (the column no-checks), the peers' work only")
    ap.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "tpu-shards-bench-peers"),
                    help="generated images (cached), outputs (default: a folder under the temporary folder)")
    ap.add_argument("--json", help="also write every run's figures to this file")
    args = ap.parse_args(argv)
    if args.tiny < 1 or args.count <= args.tiny:
        ap.error("--count must be more than --tiny, and --tiny at least 1")
    if args.rounds < 1 or args.workers < 1:
        ap.error("--rounds and --workers must be at least 1")
    if not (shutil.which(args.peers_python) and os.access(shutil.which(args.peers_python), os.X_OK)):
        ap.error(f"--peers-python {args.peers_python}: no such program")
    return args


class Runner:
    """Runs each tool on an input folder as a whole process and keeps its measurements."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.work = Path(args.work)
        self.runs: dict[tuple[str, str, int], list[Run]] = {}
        self.failed: list[str] = []

    def command(self, tool: str, mode: str, source: Path, out: Path) -> tuple[list[str], dict[str, str], str]:
        """(argv, environment, folder to run in) of one run."""
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": os.pathsep.join([str(HERE.parent), str(HERE)])}
        if tool in OURS:
            argv = [sys.executable, "-c", "from beam_jobs.cli import console; console()", "build",
                    "--input", str(source), "--output", str(out), "--overwrite", "--no-progress",
                    "--workers", str(self.args.workers), *MODE_ARGS[mode], *OURS[tool],
                    *shlex.split(self.args.tpu_shards_args)]
            return argv, env, str(HERE.parent)
        env["PYTHONPATH"] = str(HERE)  # the peers' Python sees peers_bench, not the project
        return ([self.args.peers_python, "-m", "peers_bench.child", tool, mode, str(source), str(out),
                 str(self.args.workers)], env, str(HERE))

    def run(self, tool: str, mode: str, source: Path, count: int) -> Run:
        out = self.work / "out" / tool
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        run = timed(*self.command(tool, mode, source, out), timeout=TIMEOUT)
        written = outputs.records(tool, out) if run.returncode == 0 else 0
        if run.returncode == 0 and written != count:
            run = Run(run.wall, run.cpu, run.peak_mb, 1, f"wrote {written} of {count} records")
        shutil.rmtree(out, ignore_errors=True)
        return run

    def probe(self, tools: list[str], source: Path, count: int) -> dict[str, str]:
        """A first, untimed run of each tool (it also warms the page cache): {tool: why} for those missing."""
        missing = {}
        for tool in tools:
            run = self.run(tool, "pass", source, count)
            if run.returncode == MISSING and tool not in OURS:
                missing[tool] = run.tail.strip().splitlines()[-1].removeprefix("missing: ")
            elif run.returncode:
                self.failed.append(f"{tool} (warm-up): exit {run.returncode}: {run.tail.strip()[-600:]}")
            log(f"warm-up {tool:<10} {run.wall:6.2f} s" + (" missing" if tool in missing else ""))
        return missing

    def measure(self, tool: str, mode: str, source: Path, count: int) -> None:
        run = self.run(tool, mode, source, count)
        if run.returncode:
            self.failed.append(f"{tool} {mode} {count}: exit {run.returncode}: {run.tail.strip()[-600:]}")
            return
        self.runs.setdefault((tool, mode, count), []).append(run)
        log(f"{tool:<10} {mode:<8} {count:>6} images {run.wall:7.2f} s wall {run.cpu:7.2f} s CPU "
            f"{run.peak_mb:6.0f} MB")


def warm_page_cache(folder: Path) -> float:
    """Every file under `folder` read once (seconds taken): no tool's clock, the first round's first one's above all,
    pays for reading cold images from disk (the warm-up runs read only the small set)."""
    began = time.perf_counter()
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            with open(path, "rb") as f:
                while f.read(1 << 20):
                    pass
    return time.perf_counter() - began


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def pillow_versions(peers_python: str) -> str:
    """Pillow's version here and in the peers' environment (they should be the same: every tool decodes with it)."""
    import PIL

    theirs = subprocess.run([peers_python, "-c", "import PIL; print(PIL.__version__)"], capture_output=True,
                            text=True).stdout.strip() or "absent"
    return f"Pillow {PIL.__version__} (tpu-shards), {theirs} (peers)" + ("" if theirs == PIL.__version__ else
                                                                          ": NOT THE SAME")


def header(args: argparse.Namespace, argv: list[str], missing: dict[str, str], pillows: str) -> str:
    load = os.getloadavg()
    lines = [f"command: {shlex.join(['python', 'benchmarks/bench_peers.py', *argv])}",
             f"{args.count} images ({args.kind}: {'~400x400' if args.kind == 'jpg' else 'phone-size'} JPEGs), fixed "
             f"cost from {args.tiny}; {args.workers} workers where the tool has them (TFDS: one process); medians of "
             f"{args.rounds} alternating rounds",
             f"machine: {os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}; load average "
             f"at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {pillows}"]
    lines += [f"missing: {tool} ({why})" for tool, why in missing.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    runner = Runner(args)
    big = data.input_folder(runner.work, args.kind, args.count, args.workers)
    tiny = data.input_folder(runner.work, args.kind, args.tiny, args.workers)
    pillows = pillow_versions(args.peers_python)
    ours = ["tpu-shards", *(["no-checks"] if args.checks_off else [])]
    missing = runner.probe([*ours, *args.peers], tiny, args.tiny)
    log(f"read the {args.count} images once, untimed, in {warm_page_cache(big):.1f} s")
    tools = [*ours, *(p for p in args.peers if p not in missing)]
    for r in range(args.rounds):
        order = tools[r % len(tools):] + tools[:r % len(tools)]
        for mode in args.modes:
            for tool in order if r % 2 == 0 else order[::-1]:
                runner.measure(tool, mode, big, args.count)
                runner.measure(tool, mode, tiny, args.tiny)
        log(f"after round {r + 1}:\n" + table(runner.runs, tools, args.modes, args.count, args.tiny))
    print(header(args, argv, missing, pillows))
    print(table(runner.runs, tools, args.modes, args.count, args.tiny))
    for failure in runner.failed:
        print(f"FAILED: {failure}")
    if args.json:
        Path(args.json).write_text(json.dumps({f"{t} {m} {n}": [vars(run) for run in runs]
                                               for (t, m, n), runs in runner.runs.items()}, indent=1))
    return 1 if runner.failed else 0


if __name__ == "__main__":
    sys.exit(main())
