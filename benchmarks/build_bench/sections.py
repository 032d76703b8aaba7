"""The printed sections of the main benchmark: each returns a block of text for one comparison.

Two kinds of figures side by side: wall-clock rates (what the targets are stated in; sensitive to a
shared machine) and CPU milliseconds per image summed over every process involved (a per-core cost
that other tenants' load disturbs much less).
"""
from __future__ import annotations

from .bench import JOB_PATHS, Bench
from .results import fmt, ratio, table, verdict

COLUMNS = ["", "procs", "seconds", "img/s", "steady img/s", "fixed s", "CPU ms/img", "steady CPU ms/img",
           "cores busy", "steady cores", "peak tree MB"]


def _baseline_row(bench: Bench, label: str, key: tuple, procs: int) -> list:
    t = bench.board.get(key)
    return [label, procs, fmt(t.seconds, 2), fmt(bench.rate(key)), "", "", fmt(bench.cpu_ms(key), 2), "",
            fmt(ratio(t.cpu, t.seconds), 2), "", ""]


def _job_row(bench: Bench, label: str, key: tuple, procs: int) -> list:
    """key: without the count. Cores busy = CPU seconds / wall seconds (steady: per image, start-up excluded)."""
    full = (*key, bench.n)
    t = bench.board.get(full)
    steady_cores = bench.steady_cpu_ms(key) * bench.steady(key) / 1e3
    return [label, procs, fmt(t.seconds, 2), fmt(bench.rate(full)), fmt(bench.steady(key)), fmt(bench.fixed(key), 2),
            fmt(bench.cpu_ms(full), 2), fmt(bench.steady_cpu_ms(key), 2), fmt(ratio(t.cpu, t.seconds), 2),
            fmt(steady_cores, 2), fmt(t.peak_mb, 0)]


def _ends(bench: Bench) -> list[int]:
    return sorted({1, bench.all})


def _around(bench: Bench, path: str) -> list[str]:
    """Per image: the job's steady CPU minus its encode step's CPU alone = what the pipeline around it costs."""
    out = []
    for w in _ends(bench):
        job = bench.steady_cpu_ms(("job", path, w))
        alone = bench.cpu_ms(("encode", path, w, bench.n))
        out.append(f"  CPU per image, {path}, {w} worker(s): job steady {fmt(job, 2)} ms = encode_item {fmt(alone, 2)}"
                   f" ms + Beam, pipes, writing runs and shards {fmt(job - alone, 2)} ms")
    return out


def reencode(bench: Bench) -> str:
    n, all_w = bench.n, bench.all
    rows = [_baseline_row(bench, f"Pillow loop (decode + encode q75), {w} proc", ("pillow", w, n), w)
            for w in _ends(bench)]
    rows += [_baseline_row(bench, f"job's encode_item alone (no Beam), {w} proc", ("encode", "reencode", w, n), w)
             for w in _ends(bench)]
    rows += [_job_row(bench, f"job --workers {w}", ("job", "reencode", w), w) for w in _ends(bench)]
    lines = [f"1. Re-encode path: {n} PNG -> JPEG q75 (~400x400, {bench.mb['png', n]:.0f} MB of PNG)",
             table(COLUMNS, rows)]
    for w in _ends(bench):
        pillow = bench.rate(("pillow", w, n))
        e2e, steady = ratio(bench.rate(("job", "reencode", w, n)), pillow), ratio(bench.steady(("job", "reencode", w)),
                                                                                  pillow)
        cpu = ratio(bench.cpu_ms(("pillow", w, n)), bench.steady_cpu_ms(("job", "reencode", w)))
        targets = f"  end to end {verdict(e2e, 0.7)}, steady {verdict(steady, 0.8)}" if w == all_w else ""
        lines.append(f"  job / Pillow loop, {w} process(es): end to end {fmt(e2e, 2)}x, steady {fmt(steady, 2)}x, "
                     f"CPU per image (Pillow / job steady) {fmt(cpu, 2)}x" + targets)
    if bench.args.big_factor:
        big = n * bench.args.big_factor
        marginal = bench.marginal(("job", "reencode", all_w), n, big)
        lines.append(f"  job --workers {all_w}, marginal {n} -> {big} images: {fmt(marginal)} img/s = "
                     f"{fmt(ratio(marginal, bench.rate(('pillow', all_w, n))), 2)}x the Pillow loop with {all_w} "
                     "processes")
    return "\n".join(lines + _around(bench, "reencode"))


def passthrough(bench: Bench) -> str:
    n, all_w = bench.n, bench.all
    rows = []
    for name, label in (("floor", "floor (read, 1/8 decode, sha256, Example, frame, write)"),
                        ("floor-nodecode", "floor without the decode (for --validate structure)"),
                        ("balanced", "balanced floor (floor + sorted runs + shards merged, hashed, fsynced)"),
                        ("balanced-nodecode", "balanced floor without the decode")):
        rows += [_baseline_row(bench, f"{label}, {w} proc", (name, "jpg", w, n), w) for w in _ends(bench)]
    for path in ("decode", "structure"):
        rows += [_baseline_row(bench, f"job's encode_item alone, --validate {path}, {w} proc",
                               ("encode", path, w, n), w) for w in _ends(bench)]
    for path in ("decode", "structure"):
        rows += [_job_row(bench, f"job --validate {path} --workers {w}", ("job", path, w), w) for w in _ends(bench)]
    lines = [f"2. Pass-through path: {n} JPEGs (~400x400 q90, {bench.mb['jpg', n]:.0f} MB)", table(COLUMNS, rows)]
    for path, floor in (("decode", "floor"), ("structure", "floor-nodecode")):
        for w in _ends(bench):
            wall = ratio(bench.steady(("job", path, w)), bench.rate((floor, "jpg", w, n)))
            cpu = ratio(bench.cpu_ms((floor, "jpg", w, n)), bench.steady_cpu_ms(("job", path, w)))
            target = verdict(wall, 0.8) if path == "decode" else "(no target)"
            lines.append(f"  job --validate {path} steady / {floor}, {w} process(es): {fmt(wall, 2)}x {target}; "
                         f"CPU per image ({floor} / job steady) {fmt(cpu, 2)}x")
    for path, floor, one_pass in (("decode", "balanced", "floor"),
                                  ("structure", "balanced-nodecode", "floor-nodecode")):
        for w in _ends(bench):
            wall = ratio(bench.steady(("job", path, w)), bench.rate((floor, "jpg", w, n)))
            cost = ratio(bench.rate((floor, "jpg", w, n)), bench.rate((one_pass, "jpg", w, n)))
            lines.append(f"  job --validate {path} steady / {floor} floor, {w} process(es): {fmt(wall, 2)}x "
                         f"(the balanced floor itself is {fmt(cost, 2)}x the one-pass floor: what exact balance costs)")
    if bench.args.big_factor:
        big = n * bench.args.big_factor
        marginal = bench.marginal(("job", "decode", all_w), n, big)
        r = ratio(marginal, bench.rate(("floor", "jpg", all_w, n)))
        lines.append(f"  job --validate decode, {all_w} workers, marginal {n} -> {big} images: {fmt(marginal)} img/s "
                     f"= {fmt(r, 2)}x the floor with {all_w} processes  {verdict(r, 0.8)}")
    if all_w > 1:
        job = ratio(bench.steady(("job", "decode", all_w)), bench.steady(("job", "decode", 1)))
        floor = ratio(bench.rate(("floor", "jpg", all_w, n)), bench.rate(("floor", "jpg", 1, n)))
        lines.append(f"  scaling 1 -> {all_w}: job steady {fmt(job, 2)}x, floor {fmt(floor, 2)}x; "
                     f"job scaling / floor scaling {fmt(ratio(job, floor), 2)}")
    return "\n".join(lines + _around(bench, "decode") + _around(bench, "structure"))


def tfds(bench: Bench) -> str:
    n, all_w = bench.n, bench.all
    if bench.args.no_tfds:
        return "3. TFDS: skipped (--no-tfds)"
    rows = []
    for kind, path, label in (("png", "reencode", "PNG -> JPEG q75"), ("jpeg", "structure", "JPEG kept")):
        rows.append(_job_row(bench, f"TFDS builder, {label}", ("tfds", kind), 1))
        rows.append(_job_row(bench, f"job {' '.join(JOB_PATHS[path][1])}, {all_w} workers", ("job", path, all_w),
                             all_w))
    lines = [f"3. The peer: TensorFlow Datasets GeneratorBasedBuilder.download_and_prepare() in one process, same "
             f"{n} files", table(COLUMNS, rows)]
    for kind, path, target in (("png", "reencode", 1.5), ("jpeg", "structure", 1.0)):
        e2e = ratio(bench.rate(("job", path, all_w, n)), bench.rate(("tfds", kind, n)))
        steady = ratio(bench.steady(("job", path, all_w)), bench.steady(("tfds", kind)))
        cpu = ratio(bench.steady_cpu_ms(("tfds", kind)), bench.steady_cpu_ms(("job", path, all_w)))
        what = "re-encode" if kind == "png" else "pass-through (--validate structure)"
        lines.append(f"  job / TFDS, {what}: end to end {fmt(e2e, 2)}x {verdict(e2e, target)}, steady "
                     f"{fmt(steady, 2)}x; CPU per image (TFDS / job, steady) {fmt(cpu, 2)}x")
    if bench.tfds_check:
        jpeg, png = bench.tfds_check["jpeg"], bench.tfds_check["png"]
        lines.append(f"  checked on {jpeg['records']} JPEGs: TFDS stores the files' bytes unchanged: "
                     f"{jpeg['bytes_unchanged']}; image decodes in its build (cProfile): "
                     f"{sum(jpeg['decode_calls'].values())}, i.e. it neither decodes nor validates JPEGs")
        lines.append(f"  checked on {png['records']} PNGs: TFDS stores JPEG: {png['all_jpeg']}, byte for byte what "
                     f"Pillow's save(quality=75) writes (as the job at --jpeg-quality 75): {png['equals_pillow_q75']}; "
                     f"decode calls seen: {sum(png['decode_calls'].values())} (the check does see decodes)")
    return "\n".join(lines)


def scaling(bench: Bench) -> str:
    n = bench.n
    rows = []
    for w in bench.workers:
        row: list = [w]
        for path in ("reencode", "decode", "structure"):
            row += [fmt(bench.rate(("job", path, w, n))), fmt(bench.steady(("job", path, w)))]
        row += [fmt(bench.rate(("pillow", w, n))), fmt(bench.rate(("floor", "jpg", w, n)))]
        row.append(fmt(max(bench.board.get(("job", p, w, n)).peak_mb for p in ("reencode", "decode", "structure")), 0))
        rows.append(row)
    lines = [f"4. Scaling with workers ({n} images; img/s end to end, then steady)",
             table(["workers", "re-encode", "steady", "decode", "steady", "structure", "steady", "Pillow", "floor",
                    "peak tree MB"], rows)]
    low, high = bench.workers[0], bench.workers[-1]
    if high > low:
        for path in ("reencode", "decode", "structure"):
            e2e = ratio(bench.rate(("job", path, high, n)), bench.rate(("job", path, low, n)))
            steady = ratio(bench.steady(("job", path, high)), bench.steady(("job", path, low)))
            target = f"  {verdict(steady, 1.7)}" if (low, high) == (1, 2) else ""
            lines.append(f"  job {path}: {high} / {low} workers: end to end {fmt(e2e, 2)}x, steady {fmt(steady, 2)}x"
                         + target)
        for path in ("reencode", "decode", "structure"):
            driver = bench.steady_driver_ms(("job", path, high))
            lines.append(f"  job {path}: the driver's own CPU per image, steady, {high} workers: {fmt(driver, 3)} ms; "
                         "its work is serial, so no number of workers takes this path past "
                         f"{fmt(ratio(1e3, driver), 0)} img/s on such cores")
        for name, key in (("Pillow loop", lambda w: ("pillow", w, n)), ("floor", lambda w: ("floor", "jpg", w, n))):
            scaled = ratio(bench.rate(key(high)), bench.rate(key(low)))
            lines.append(f"  {name}: {high} / {low} processes: {fmt(scaled, 2)}x (what the machine gave the baselines)")
    return "\n".join(lines)


def memory(bench: Bench) -> str:
    n, all_w, factor = bench.n, bench.all, bench.args.big_factor
    lines = ["5. Memory: peak RSS of the whole process tree (driver + encode workers, summed, polled every 0.1 s)"]
    if factor:
        rows = []
        for path in ("reencode", "decode"):
            small, big = bench.board.get(("job", path, all_w, n)), bench.board.get(("job", path, all_w, n * factor))
            r = ratio(big.peak_mb, small.peak_mb)
            rows.append([f"job {path}, {all_w} workers", fmt(small.peak_mb, 0), fmt(big.peak_mb, 0), fmt(r, 2),
                         verdict(r, 1.3, at_most=True), fmt(small.driver_mb, 0), fmt(big.driver_mb, 0),
                         fmt(ratio(big.driver_mb, small.driver_mb), 2),
                         fmt(bench.rate(("job", path, all_w, n * factor))),
                         fmt(bench.marginal(("job", path, all_w), n, n * factor))])
        lines.append(table(["", f"MB at {n}", f"MB at {n * factor}", "ratio", "", f"driver MB at {n}",
                            f"at {n * factor}", "ratio", f"img/s at {n * factor}",
                            f"marginal img/s {n} -> {n * factor}"], rows))
        lines.append("  the driver holds the listing (local builds plan runs from it); the rest of the tree is the "
                     "workers: each encodes one run at a time and copies shards in 4 MiB blocks")
    if len(bench.workers) > 1:
        low, rows = bench.workers[0], []
        for w in bench.workers:
            row: list = [w]
            for path in ("reencode", "decode"):
                mb = bench.board.get(("job", path, w, n)).peak_mb
                row += [fmt(mb, 0), fmt(ratio(mb, bench.board.get(("job", path, low, n)).peak_mb), 2)]
            rows.append(row + [fmt(w / low, 2)])
        lines.append(table(["workers", "re-encode MB", "x", "pass-through MB", "x", f"workers / {low} (linear)"],
                           rows))
    return "\n".join(lines)


def cost(bench: Bench) -> str:
    rows = []
    for path in ("reencode", "decode", "structure"):
        for w in _ends(bench):
            key = ("job", path, w)
            cpu_ms = bench.steady_cpu_ms(key)
            wall_per_core = bench.steady(key) / w
            rows.append([f"{path}, {w} worker(s)", fmt(wall_per_core), fmt(1e6 / wall_per_core / 3600, 2),
                         fmt(cpu_ms, 2), fmt(1e3 / cpu_ms), fmt(cpu_ms / 3.6, 2)])
    return "\n".join([
        "6. Cost per core, steady state (vCPU-hours per million images = 1e6 / (img/s per vCPU) / 3600)",
        table(["", "img/s per core (wall)", "vCPU-h per 1M (wall)", "CPU ms/img", "img/s per CPU-s",
               "CPU-h per 1M"], rows),
        "  wall: steady img/s / workers (assumes the cores were the job's alone); CPU: user + system time of the "
        "driver and workers, which a shared machine disturbs less (the driver's own share included)",
    ])
