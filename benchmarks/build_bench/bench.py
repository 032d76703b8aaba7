"""One benchmark run: its options, its inputs, what it measured, and the rates derived from that.

Keys of the board: ("job", path, workers, count), ("tfds", kind, count), ("pillow", workers, count),
("floor" | "floor-nodecode", kind, workers, count), ("balanced" | "balanced-nodecode", "jpg", workers, count),
("encode", path, workers, count).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from . import baselines, data
from .results import Board, Timing, per_image, timing_of
from .runner import Runs

JOB_PATHS = {  # name: (image kind, job flags, what it is)
    "reencode": ("png", ("--jpeg-quality", "75"), "re-encode: PNG in, JPEG q75 out"),
    "decode": ("jpg", (), "pass-through: JPEG in, --validate decode (default)"),
    "decode-off": ("jpg", ("--quality-checks", "off"), "pass-through: JPEG in, --validate decode, no quality checks"),
    "structure": ("jpg", ("--validate", "structure"), "pass-through: JPEG in, --validate structure"),
    "small": ("small", (), "pass-through: 64x64 JPEGs, --validate decode"),
}


def log(message: str) -> None:
    """Progress goes to stderr; the report (stdout) stays copy-pasteable."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Bench:
    """Runs the measurements of one benchmark and derives rates from them."""

    def __init__(self, args: argparse.Namespace, cores: int, workers: list[int]):
        self.args, self.cores, self.workers = args, cores, workers
        self.all = cores if cores in workers else workers[-1]  # "all cores" in the comparisons
        self.n, self.tiny = args.count, args.tiny
        self.work = Path(args.work).resolve()
        self.runs = Runs(self.work)
        self.board = Board()
        self.tfds_check: dict[str, dict] = {}
        self.inputs: dict[tuple[str, int], Path] = {}
        self.mb: dict[tuple[str, int], float] = {}

    # ------------------------------------------------------------------ measuring

    def input(self, kind: str, count: int) -> Path:
        """The input folder of `count` images of a kind (generated or linked on first use)."""
        if (kind, count) not in self.inputs:
            start = time.perf_counter()
            folder = data.input_folder(self.work, kind, count, self.cores)
            self.inputs[kind, count] = folder
            self.mb[kind, count] = data.source_bytes(folder) / 1e6
            log(f"input {kind} x {count}: {folder} ({self.mb[kind, count]:.0f} MB, ready in "
                f"{time.perf_counter() - start:.1f} s)")
        return self.inputs[kind, count]

    def job(self, path: str, workers: int, count: int, profile: Path | None = None) -> dict:
        kind, flags, _ = JOB_PATHS[path]
        log(f"job {path} x {count}, --workers {workers}{' (profiled)' if profile else ''}")
        label = f"{path}-{count}-w{workers}" + ("-profiled" if profile else "")
        result = self.runs.job(label, self.input(kind, count), workers, *flags, profile=profile)
        if profile is None:
            self.add(("job", path, workers, count), timing_of(result))
        return result

    def tfds(self, kind: str, count: int) -> None:
        log(f"TFDS builder {kind} x {count}")
        source = self.input("png" if kind == "png" else "jpg", count)
        self.add(("tfds", kind, count), timing_of(self.runs.tfds(f"{kind}-{count}", kind, source)))

    def check_tfds(self) -> None:
        for kind in ("jpeg", "png"):
            log(f"checking what TFDS does with {kind} input")
            source = self.input("png" if kind == "png" else "jpg", self.tiny)
            self.tfds_check[kind] = self.runs.tfds(f"check-{kind}", kind, source, check=True)

    def pillow(self, workers: int, count: int) -> None:
        log(f"Pillow loop x {count}, {workers} processes")
        wall, cpu = baselines.time_pillow(self.input("png", count), workers, 75)
        self.add(("pillow", workers, count), Timing(wall, cpu))

    def floor(self, workers: int, count: int, kind: str = "jpg", decode: bool = True) -> None:
        log(f"pass-through floor x {count}, {workers} processes{'' if decode else ', no decode'}")
        wall, cpu = baselines.time_floor(self.input(kind, count), workers, self.work / "floor-out", decode)
        self.add(("floor" if decode else "floor-nodecode", kind, workers, count), Timing(wall, cpu))

    def balanced_floor(self, workers: int, count: int, decode: bool = True) -> None:
        log(f"balanced (two-pass) floor x {count}, {workers} processes{'' if decode else ', no decode'}")
        wall, cpu = baselines.time_balanced_floor(self.input("jpg", count), workers, self.work / "floor-out", decode)
        self.add(("balanced" if decode else "balanced-nodecode", "jpg", workers, count), Timing(wall, cpu))

    def encode_alone(self, path: str, workers: int, count: int) -> None:
        quality = 75 if path == "reencode" else 95
        validate = "structure" if path == "structure" else "decode"
        log(f"the job's encode_item alone, {path} x {count}, {workers} processes")
        wall, cpu = baselines.time_job_encode(self.input(JOB_PATHS[path][0], count), workers, quality, validate)
        self.add(("encode", path, workers, count), Timing(wall, cpu))

    def add(self, key: tuple, timing: Timing) -> None:
        """Keep a measurement and log it at once: a run cut short (a time limit) still shows what it measured."""
        self.board.add(key, timing)
        log(f"  {' '.join(map(str, key))}: {timing.seconds:.3f} s, {timing.cpu:.3f} CPU s")

    # ------------------------------------------------------------------ derived

    def seconds(self, key: tuple) -> float:
        return self.board.get(key).seconds

    def rate(self, key: tuple) -> float:
        """Images/s end to end (the key ends with the image count)."""
        return key[-1] / self.seconds(key)

    def cpu_ms(self, key: tuple) -> float:
        """CPU milliseconds per image end to end, all processes."""
        return 1e3 * self.board.get(key).cpu / key[-1]

    def steady(self, key: tuple, count: int | None = None) -> float:
        """Images/s without the fixed start-up: against the build of --tiny images (key without the count)."""
        count = count or self.n
        return 1 / per_image(count, self.tiny, self.seconds((*key, count)), self.seconds((*key, self.tiny)))

    def steady_cpu_ms(self, key: tuple, count: int | None = None) -> float:
        """CPU milliseconds per image without the fixed start-up (key without the count)."""
        count = count or self.n
        return 1e3 * per_image(count, self.tiny, self.board.get((*key, count)).cpu,
                               self.board.get((*key, self.tiny)).cpu)

    def steady_driver_ms(self, key: tuple, count: int | None = None) -> float:
        """The driver process's own CPU milliseconds per image without the fixed start-up (key without the count):
        work done in one process, so 1000 / it is the most img/s any number of workers can reach."""
        count = count or self.n
        return 1e3 * per_image(count, self.tiny, self.board.get((*key, count)).driver_cpu,
                               self.board.get((*key, self.tiny)).driver_cpu)

    def marginal(self, key: tuple, low: int, high: int) -> float:
        """Images/s between two sizes of one build: less noisy than `steady` when the start-up is a large
        part of the smaller build."""
        return 1 / per_image(high, low, self.seconds((*key, high)), self.seconds((*key, low)))

    def fixed(self, key: tuple) -> float:
        """The fixed start-up: the wall time of the --tiny build (key without the count)."""
        return self.seconds((*key, self.tiny))
