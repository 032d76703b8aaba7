"""The per-image CPU of a build's encode workers against the peers' floor, in one process, no start-up.

    python benchmarks/bench_encode_item.py [--count 200] [--phone 40] [--png 0] [--rounds 3] [--profile FILE]
        [--pieces] [--against TREE]

On the peers benchmark's photo-like JPEGs (benchmarks/build_bench/data.py: ~400x400 and phone-size 1200 x
1312-1600), and with `--png N` on bench_build's ~400x400 PNGs, each round times, interleaved, over the same files
read from disk:
- tpu-shards: `encode_run` (what a local pool worker runs per run: read, `encode_item`'s decode check or re-encode
  with the quality checks, sha256, the tf.train.Example, its framing and the run file), with `--quality-checks`
  on (the default) and off;
- the peers' work per image (benchmarks/peers_bench/work.py): the file read and `checked` (a 1/8-scale draft
  decode) or `reencoded` (draft, centre crop, bicubic resize to 224, JPEG quality 75); for `structure`
  (`--validate structure`, the JPEG passed through after a check of its markers) the file read alone;
- PNGs: `--jpeg-quality 75` at full size (bench_build's re-encode) against what TFDS's builder does with each
  (build_bench/tfds_child.py): the file read, decoded and saved by Pillow as JPEG at quality 75.
Printed: the median over the rounds of CPU ms per image for each, and tpu-shards' ratio to the peers' floor. The
pickling of a chunk between the driver and the pool is not in it. `--profile FILE` writes a cProfile of one more
pass of each mode with the checks on (`python -m pstats FILE`) and prints its top functions. `--pieces` times, in
one more pass of each mode with the checks on and off, the CPU per image of the decode (`_load`, or `decoded_plain`
for a plain JPEG), of `inspect` and of its parts (the signature, the sharpness, the colour spread), and of what the
build does that the peers' floor does not besides the checks (the JPEG's marker walk, the source's SHA-256, the
record's framing with its CRC32Cs, the run writer's running CRC32C and SHA-256) where the build calls them, caches as
cold as there; then the build's CPU per image less those beside the floor's. `--against TREE` times another
checkout's `encode_run` (checks on and off) in the same rounds, for a side-by-side before/after: each tree's in a
child process of its own that imports that tree's code (the same process layout for both: a process holding more,
as the one running the peers' floor does, was measured up to a fifth slower at the same code).
"""
from __future__ import annotations

import argparse
import collections
import cProfile
import functools
import io
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
TREE_VARIABLE = "BENCH_ENCODE_ITEM_TREE"  # set for --against's child: the checkout whose code it times
sys.path[:0] = [os.environ.get(TREE_VARIABLE) or str(HERE.parent), str(HERE)]

from build_bench import data  # noqa: E402
from peers_bench import work  # noqa: E402
from PIL import Image  # noqa: E402

from shard_utils.format.image_size import ImageSize  # noqa: E402
from shard_utils.inputs import MediaItem  # noqa: E402
from shard_utils.media import encode, images  # noqa: E402
from shard_utils.media.encode import EncodeSettings  # noqa: E402
from shard_utils.media.images import ImageOptions  # noqa: E402
from shard_utils.quality import flags  # noqa: E402
from shard_utils.sharding import runs  # noqa: E402
from shard_utils.sharding.encode_run import RunTask, encode_run  # noqa: E402

MODES = ("decode", "reencode", "structure")
FULL = "q75-full"  # the PNGs' only mode: re-encoded at their own size


def settings(mode: str, inspect: bool, labels: dict[str, int]) -> EncodeSettings:
    """What `tpu-shards build` encodes with in the peers benchmark's mode (`--validate decode`, `--validate
    structure`, or `--image-size 224 --jpeg-quality 75`), with `--quality-checks` on or off."""
    size = ImageSize(work.SIDE, work.SIDE) if mode == "reencode" else None
    quality = work.QUALITY if mode == "reencode" else 95
    validate = "structure" if mode == "structure" else "decode"
    return EncodeSettings(image=ImageOptions(size=size, quality=quality, validate=validate, inspect=inspect),
                          label_ids=labels)


def items(folder: Path) -> list[MediaItem]:
    paths = work.files_in(str(folder))
    return [MediaItem(str(Path(p).relative_to(folder)), p, Path(p).stat().st_size, (Path(p).parent.name,))
            for p in paths]


def cpu_ms(fn: Callable[[], object], count: int) -> float:
    start = time.process_time()
    fn()
    took = (time.process_time() - start) * 1000 / count
    getattr(fn, "tidy", lambda: None)()  # untimed: what the call left behind, removed
    return took


class TpuShards:
    """encode_run of one run into a folder of its own for each call, removed after the call is timed (`tidy`): a
    run file written over the one before it costs the freeing of that one's pages, which a build never pays."""

    def __init__(self, task: RunTask, how: EncodeSettings, temp: str):
        self.task, self.how, self.temp, self.folder = task, how, temp, ""

    def __call__(self) -> object:
        self.folder = tempfile.mkdtemp(dir=self.temp)
        return encode_run(self.task, self.how, self.folder)

    def tidy(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def tpu_shards(task: RunTask, how: EncodeSettings, temp: str) -> Callable[[], object]:
    return TpuShards(task, how, temp)


def peers(paths: list[str], mode: str) -> Callable[[], object]:
    if mode == FULL:
        return lambda: [saved_as_jpeg(p) for p in paths]
    return lambda: [work.image_bytes(p, mode) for p in paths]


def saved_as_jpeg(path: str) -> bytes:
    """What TFDS's builder stores for a PNG handed to it opened: Pillow's JPEG at quality 75."""
    with open(path, "rb") as f, Image.open(io.BytesIO(f.read())) as image:
        out = io.BytesIO()
        image.save(out, "JPEG", quality=work.QUALITY)
    return out.getvalue()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=200, help="~400x400 photos (default 200)")
    ap.add_argument("--phone", type=int, default=40, help="phone-size photos (default 40)")
    ap.add_argument("--png", type=int, default=0, help="~400x400 PNGs re-encoded at full size (default 0)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", default="", help="folder caching the generated images (default: a temporary one)")
    ap.add_argument("--profile", default="", help="write a cProfile of one pass of each mode here")
    ap.add_argument("--pieces", action="store_true", help="time the decode, inspect and its parts in one more pass")
    ap.add_argument("--against", default="", help="another checkout whose encode_run is timed in the same rounds")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # --against's child
    args = ap.parse_args(argv)
    if args.count < 1 or args.phone < 0 or args.png < 0 or args.rounds < 1:
        ap.error("--count and --rounds must be at least 1, --phone and --png at least 0")
    with tempfile.TemporaryDirectory() as temp:
        root = Path(args.work or temp)
        kinds = [("jpg", args.count), ("phone", args.phone), ("png", args.png)]
        kinds = [(kind, count) for kind, count in kinds if count]
        folders = {kind: data.input_folder(root, kind, count, 2) for kind, count in kinds}
        if args.serve:
            return serve(cases_of(folders, temp))
        if not args.against:
            return run(folders, args, temp)
        children = {"": Child(HERE.parent, args, root), AGAINST: Child(Path(args.against), args, root)}
        try:
            return run(folders, args, temp, children)
        finally:
            for child in children.values():
                child.close()


def cases_of(folders: dict[str, Path], temp: str) -> dict:
    """(kind, mode): (image count, {tool: what it runs once over the images})."""
    cases = {}
    for kind, folder in folders.items():
        listed = items(folder)
        labels = {name: i for i, name in enumerate(sorted({i.labels[0] for i in listed}))}
        task = RunTask("train", 0, tuple(listed))
        paths = [i.uri for i in listed]
        for mode in (FULL,) if kind == "png" else MODES:
            cases[(kind, mode)] = (len(listed), {
                "tpu-shards": tpu_shards(task, settings(mode, True, labels), temp),
                "tpu-shards, checks off": tpu_shards(task, settings(mode, False, labels), temp),
                "peers' floor": peers(paths, mode)})
    return cases


def serve(cases: dict) -> int:
    """--against's child: time the named tool of a case for each line "kind mode tool" read, and answer its CPU ms
    per image."""
    print("ready", flush=True)
    for line in sys.stdin:
        kind, mode, tool = line.rstrip("\n").split("\t")
        count, tools = cases[(kind, mode)]
        print(cpu_ms(tools[tool], count), flush=True)
    return 0


class Child:
    """A checkout's encode_run, timed in a child process of this script that imports that tree's code."""

    def __init__(self, tree: Path, args: argparse.Namespace, root: Path):
        sizes = ["--count", str(args.count), "--phone", str(args.phone), "--png", str(args.png)]
        env = {**os.environ, TREE_VARIABLE: str(tree.resolve())}
        self.child = subprocess.Popen([sys.executable, __file__, *sizes, "--work", str(root), "--serve"], env=env,
                                      text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        if self.child.stdout.readline().strip() != "ready":
            raise SystemExit(f"bench_encode_item: the child timing {tree} did not start")

    def tool(self, kind: str, mode: str, name: str) -> Callable[[], float]:
        """A call returning what the child's `name` cost in CPU ms per image, timed there."""
        def timed() -> float:
            self.child.stdin.write(f"{kind}\t{mode}\t{name}\n")
            self.child.stdin.flush()
            return float(self.child.stdout.readline())
        return timed

    def close(self) -> None:
        self.child.stdin.close()
        self.child.wait()


AGAINST = " (--against)"  # the other checkout's tools are named so


def in_children(cases: dict, children: dict[str, Child]) -> set[str]:
    """Each case's tpu-shards tools run by the children instead ("" this checkout, AGAINST the other); the names of
    the tools whose calls return their own CPU ms per image."""
    timed_there = set()
    for (kind, mode), (_count, tools) in cases.items():
        for name in [n for n in tools if n.startswith("tpu-shards")]:
            for suffix, child in children.items():
                tools[name + suffix] = child.tool(kind, mode, name)
                timed_there.add(name + suffix)
    return timed_there


def run(folders: dict[str, Path], args: argparse.Namespace, temp: str,
        children: dict[str, Child] | None = None) -> int:
    cases = cases_of(folders, temp)
    local = {kind_mode: (count, dict(tools)) for kind_mode, (count, tools) in cases.items()}  # --pieces, --profile
    timed_there = in_children(cases, children) if children else set()
    times: dict[tuple, list[float]] = {}
    for r in range(args.rounds):
        for (kind, mode), (count, tools) in cases.items():
            names = list(tools) if r % 2 == 0 else list(reversed(tools))
            for name in names:
                took = tools[name]
                times.setdefault((kind, mode, name), []).append(
                    took() if name in timed_there else cpu_ms(took, count))
    print(f"CPU ms per image, median of {args.rounds} rounds (ratio to the peers' floor)")
    for (kind, mode), (count, tools) in cases.items():
        floor = statistics.median(times[(kind, mode, "peers' floor")])
        line = ", ".join(f"{name} {statistics.median(times[(kind, mode, name)]):.3f}"
                         f" ({statistics.median(times[(kind, mode, name)]) / floor:.2f}x)" for name in tools)
        print(f"{kind:5} x{count:<4} {mode:8}: {line}")
    if args.pieces:
        print_pieces(local)
    if args.profile:
        profiler = cProfile.Profile()
        for (_kind, _mode), (_count, tools) in local.items():
            profiler.runcall(tools["tpu-shards"])
        profiler.dump_stats(args.profile)
        pstats.Stats(args.profile).sort_stats("tottime").print_stats(25)
    return 0


PIECES = ((images, "_load", "decode"), (images, "decoded_plain", "decode"), (images, "inspect", "inspect"),
          (flags, "signature_of_grey", "  signature"), (flags, "sharpness", "  sharpness"),
          (flags, "colour_below", "  colour spread"), (runs.RunWriter, "_write", "  its writes"))
# What the build does per image that the peers' floor does not, apart from the quality checks: the integrity of
# what it writes (the source's SHA-256; the record's framing CRC32Cs; the run file's running CRC32C and SHA-256,
# with the buffering of its writer) and the structural check of a JPEG kept as it is (the marker walk).
EXTRA = ((images, "plain_jpeg", "marker walk"), (images, "jpeg_primary_end", "marker walk"),
         (encode, "hashlib.sha256", "source sha256"), (encode, "frame_pieces", "framing"),
         (runs.RunWriter, "add", "run writer"))
WRITES = "  its writes"  # inside the run writer's time, and work the peers do too


def print_pieces(cases: dict) -> None:
    """CPU us per image of each of PIECES and EXTRA in one pass of each mode, checks on and off: the functions are
    wrapped where the build looks them up, so they run with the caches as the build leaves them. Then the CPU per
    image of the build less EXTRA's pieces (the run writer's writes kept) beside the peers' floor."""
    spent: dict[str, float] = collections.defaultdict(float)
    restore = [_wrap(owner, name, label, spent) for owner, name, label in PIECES + EXTRA]
    extra = list(dict.fromkeys(label for *_, label in EXTRA))
    try:
        print("CPU us per image of the pieces, one pass (inspect includes the indented ones)")
        for (kind, mode), (count, tools) in cases.items():
            floor = cpu_ms(tools["peers' floor"], count)
            for tool in ("tpu-shards", "tpu-shards, checks off"):
                spent.clear()
                total = cpu_ms(tools[tool], count)
                labels = dict.fromkeys(label for *_, label in PIECES + EXTRA)
                line = ", ".join(f"{label.strip()} {spent[label] * 1e6 / count:.0f}" for label in labels
                                 if label in spent)
                print(f"  {kind:5} {mode:8} {tool:22}: {line}")
                less = total - (sum(spent[label] for label in extra) - spent[WRITES]) * 1000 / count
                print(f"  {'':5} {'':8} {'':22}  less {', '.join(extra)} (not its writes): {less:.3f} ms, the floor "
                      f"{floor:.3f} ({less / floor:.2f}x)")
    finally:
        for undo in restore:
            undo()


def _wrap(owner: object, name: str, label: str, spent: dict[str, float]) -> Callable[[], None]:
    """Replace owner.name (a dotted name: a module's attribute of an attribute) with a timed call; returns the undo.
    A name the tree no longer has is left alone."""
    head, _, tail = name.partition(".")
    if not hasattr(owner, head):
        return lambda: None
    original = getattr(owner, head)
    if tail:  # e.g. encode.hashlib.sha256: encode's `hashlib` becomes a namespace whose sha256 is timed
        if not hasattr(original, tail):
            return lambda: None
        shim = types.SimpleNamespace(**{k: getattr(original, k) for k in dir(original) if not k.startswith("__")})
        setattr(shim, tail, _timed(getattr(original, tail), label, spent))
        setattr(owner, head, shim)
    else:
        setattr(owner, head, _timed(original, label, spent))
    return lambda: setattr(owner, head, original)


def _timed(fn: Callable, label: str, spent: dict[str, float]) -> Callable:
    @functools.wraps(fn)
    def timed(*args, **kwargs):
        start = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[label] += time.thread_time() - start
    return timed


if __name__ == "__main__":
    sys.exit(main())
