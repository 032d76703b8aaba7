"""How much of a small build is start-up: a fresh `tpu-shards build` of a few images against a fresh process
that only imports Beam and its in-process runner (the floor), in alternating rounds.

    python benchmarks/bench_startup.py [--count 64] [--kind small] [--rounds 5] [--workers 2] [--tree CHECKOUT]
        [--against CHECKOUT] [--build-arg=--validate=structure ...]

Prints the median wall and CPU seconds of each (CPU: the process and its encode workers), the ratio of the
medians (with --against, another checkout's build too, timed in the same rounds: a change against main on a
shared machine), then the phases of one more build (seconds from the process's start: imports, graph construction,
Beam's translation and optimisation, the steps, what follows them), what it imports beyond the floor
(`-X importtime`) and the counts a cProfile of the driver shows (option views, DoFn introspection, bundles).
"""
from __future__ import annotations

import argparse
import json
import os
import pstats
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

from build_bench import data  # noqa: E402

FLOOR = "import apache_beam; from apache_beam.runners.portability.fn_api_runner import FnApiRunner"
NEVER = ("tensorflow", "torch", "jax", "matplotlib", "scipy", "sklearn")  # a plain local build imports none
# (the name a cProfile key ends with, the function): what the driver's profile is counted for
COUNTED = (("options/pipeline_options.py", "view_as"), ("options/pipeline_options.py", "__init__"),
           ("transforms/userstate.py", "get_dofn_specs"), ("inspect.py", "signature"),
           ("fn_api_runner/fn_runner.py", "_execute_bundle"))


TREE = HERE.parent  # the checkout whose build is timed (--tree)


def env(tree: Path | None = None) -> dict[str, str]:
    """The timed processes' environment: the checkout first on the path, its bytecode cached (as an installed
    package's is: a build that compiled its modules each time would be timing the compiler)."""
    out = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree or TREE), str(HERE)]), "TF_CPP_MIN_LOG_LEVEL": "3"}
    out.pop("PYTHONDONTWRITEBYTECODE", None)
    return out


def timed(cmd: list[str], tree: Path | None = None, **extra) -> tuple[float, float, subprocess.CompletedProcess]:
    """(wall seconds, CPU seconds of the process and its children, the finished process); `tree`: the checkout
    (default --tree)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(cmd, env={**env(tree), **extra}, capture_output=True, text=True, cwd=tree or TREE)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd[:4])}... failed ({done.returncode}): "
                         f"{done.stdout[-1500:]}{done.stderr[-1500:]}")
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, done


EXTRA: list[str] = []  # --build-arg: more arguments for every build


def build_args(source: Path, out: Path, workers: int) -> list[str]:
    return ["--input", str(source), "--output", str(out), "--overwrite", "--no-progress", "--workers", str(workers),
            *EXTRA]


def build_cmd(source: Path, out: Path, workers: int, python_flags: tuple[str, ...] = ()) -> list[str]:
    return [sys.executable, *python_flags, "-c", "from beam_jobs.cli import console; console()", "build",
            *build_args(source, out, workers)]


def imports(stderr: str) -> dict[str, int]:
    """module: its own import time in microseconds, from `-X importtime` output."""
    found = {}
    for line in stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+\d+ \|\s+(\S+)", line)
        if m:
            found[m.group(2)] = int(m.group(1))
    return found


def phases(marks: dict[str, float]) -> list[tuple[str, float]]:
    """The build's phases as (name, seconds), from the marks startup_child.py wrote."""
    spans = (("interpreter start", None, "interpreter up"), ("imports", "interpreter up", "imports done"),
             ("options, input and output checks", "imports done", "graph begun"),
             ("graph construction", "graph begun", "graph built"),
             ("translation + optimisation", "run begun", "steps begun"),
             ("steps (the run)", "steps begun", "steps done"),
             ("after the steps (manifest, summary)", "steps done", "command done"),
             ("pool start (call, overlapped)", "pool start begun", "pool start returned"))
    return [(name, marks[end] - (marks[start] if start else 0.0)) for name, start, end in spans
            if end in marks and (start is None or start in marks)]


def counted(profile: Path) -> dict[str, int]:
    stats = pstats.Stats(str(profile)).stats  # type: ignore[attr-defined]
    found = {f"{name} ({file.rsplit('/', 1)[-1]})": 0 for file, name in COUNTED}
    for (path, _, fn), (_, calls, *_rest) in stats.items():
        for file, name in COUNTED:
            if fn == name and path.endswith(file):
                found[f"{name} ({file.rsplit('/', 1)[-1]})"] += calls
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=64)
    ap.add_argument("--kind", default="small", choices=sorted(data.KINDS))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--tree", default=str(HERE.parent), help="the checkout to build with (default: this one)")
    ap.add_argument("--against", help="another checkout whose build is timed in the same rounds (e.g. main's)")
    ap.add_argument("--build-arg", action="append", default=[], help="one more build argument (repeatable)")
    ap.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "tpu-shards-bench-startup"))
    args = ap.parse_args(argv)
    if args.count < 1 or args.rounds < 1 or args.workers < 1:
        ap.error("need --count, --rounds and --workers >= 1")
    global TREE
    TREE, work = Path(args.tree).resolve(), Path(args.work)
    EXTRA[:] = args.build_arg
    source = data.input_folder(work, args.kind, args.count, args.workers)
    out = work / "out" / f"{args.kind}-{args.count}"
    trees = {"build": TREE, **({"against": Path(args.against).resolve()} if args.against else {})}
    runs: dict[str, list[tuple[float, float]]] = {"floor": [], **{what: [] for what in trees}}
    for r in range(args.rounds):
        order = list(runs) if r % 2 == 0 else list(reversed(runs))
        for what in order:
            cmd = [sys.executable, "-c", FLOOR] if what == "floor" else build_cmd(source, out, args.workers)
            wall, cpu, _ = timed(cmd, trees.get(what))
            runs[what].append((wall, cpu))
            print(f"round {r + 1} {what:<7} {wall:6.2f} s wall {cpu:6.2f} s CPU", file=sys.stderr, flush=True)
    med = {what: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for what, v in runs.items()}
    print(f"{args.count} images ({args.kind}), {args.workers} workers, medians of {args.rounds} alternating rounds"
          + (f", build arguments {' '.join(EXTRA)}" if EXTRA else ""))
    print(f"{'process':<42} {'wall s':>7} {'CPU s':>7}")
    print(f"{'import apache_beam + FnApiRunner (floor)':<42} {med['floor'][0]:7.2f} {med['floor'][1]:7.2f}")
    print(f"{'tpu-shards build':<42} {med['build'][0]:7.2f} {med['build'][1]:7.2f}")
    if args.against:
        name = "tpu-shards build of " + Path(args.against).name
        print(f"{name:<42} {med['against'][0]:7.2f} {med['against'][1]:7.2f}")
    print(f"ratio build / floor (wall): {med['build'][0] / med['floor'][0]:.2f}")
    if args.against:
        print(f"ratio build of {Path(args.against).name} / floor (wall): {med['against'][0] / med['floor'][0]:.2f}; "
              f"build / build of {Path(args.against).name}: wall {med['build'][0] / med['against'][0]:.2f}, "
              f"CPU {med['build'][1] / med['against'][1]:.2f}")

    marks_file, profile = work / "marks.json", work / "driver.prof"
    timed([sys.executable, "-m", "build_bench.startup_child", str(marks_file), "--",
           *build_args(source, out, args.workers)], STARTUP_T0=repr(time.time()))
    print("\nphases of one build (no profiler), seconds")
    for name, seconds in phases(json.loads(marks_file.read_text())):
        print(f"  {name:<40} {seconds:6.2f}")

    floor_imports = imports(timed([sys.executable, "-X", "importtime", "-c", FLOOR])[2].stderr)
    build_imports = imports(timed(build_cmd(source, out, args.workers, ("-X", "importtime")))[2].stderr)
    extra = {m: us for m, us in build_imports.items() if m not in floor_imports}
    by_package: dict[str, int] = {}
    for module, us in extra.items():
        by_package[module.split(".")[0]] = by_package.get(module.split(".")[0], 0) + us
    top = sorted(by_package.items(), key=lambda kv: -kv[1])[:6]
    print(f"\nimported beyond the floor: {len(extra)} modules, {sum(extra.values()) / 1e6:.2f} s of import time "
          f"(floor {sum(floor_imports.values()) / 1e6:.2f} s): " + ", ".join(f"{p} {us / 1e3:.0f} ms" for p, us in top))
    never = sorted({m.split(".")[0] for m in build_imports} & set(NEVER))
    print(f"imported that a plain build never needs: {', '.join(never) or 'none'}")

    timed([sys.executable, "-m", "build_bench.startup_child", str(marks_file), "--profile", str(profile), "--",
           *build_args(source, out, args.workers)], STARTUP_T0=repr(time.time()))
    print("\ncalls in the driver (cProfile of the command)")
    for name, calls in counted(profile).items():
        print(f"  {name:<40} {calls:6d}")
    return 1 if never else 0


if __name__ == "__main__":
    sys.exit(main())
