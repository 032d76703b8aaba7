"""Shared fixtures: small generated image folders and a way to run the real job on them."""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # benchmarks/ (the Cloud Storage stand-in the paging proxy uses) is not installed
    sys.path.append(str(REPO))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def photo(width: int, height: int, seed: int) -> Image.Image:
    """A smooth, photo-like RGB image (gradients plus noise), distinct per seed."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([(x * (seed % 7 + 1) + y) % 256, (y * 2 + seed * 13) % 256, (x + y * 3 + seed * 29) % 256], -1)
    noisy = base + rng.normal(0, 8, base.shape)
    return Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8), "RGB")


def write_images(root: Path, counts: dict[str, int], size=(64, 48), fmt="JPEG", ext="jpg", seed=0) -> list[Path]:
    """<root>/<label>/<i>.<ext> for each label and count; returns the paths."""
    paths = []
    for li, (label, n) in enumerate(sorted(counts.items())):
        folder = root / label
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(n):
            path = folder / f"img{i:04d}.{ext}"
            photo(*size, seed=seed + li * 1000 + i).save(path, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
            paths.append(path)
    return paths


def run_job(input_dir, output_dir, *extra: str):
    """Run the build in this process on Beam's in-process runner; returns the manifest."""
    from beam_jobs.jobs.build import run

    given = ["--input", str(input_dir)] if input_dir is not None else []  # a listing of absolute paths needs none
    return run([*given, "--output", str(output_dir), *map(str, extra)])


def run_cli(*args: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run `python -m beam_jobs.cli ARGS` in a subprocess; returns the completed process (text output)."""
    full_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    return subprocess.run([sys.executable, "-m", "beam_jobs.cli", *map(str, args)], capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=REPO)


SEAMS = REPO / "tests" / "seams"  # sitecustomize.py: faults installed in a build's processes (see there)
# Where a crash test kills a build: the first call of each function (module:function[:nth call]).
KILL_AT = {
    "encode": "shard_utils.sharding.encode_run:encode_run",
    "write": "shard_utils.sharding.writer:write_shard",
    "join-parts": "shard_utils.sharding.run_parts:join_parts",  # a run's parts encoded, the run not yet written
    "publish-start": "beam_jobs.publish.steps:clear_output",
    "publish-old-removed": "beam_jobs.publish.steps:move_shard",
    "publish-renaming": "beam_jobs.publish.steps:move_shard:2",
    "publish-before-manifest": "beam_jobs.publish.steps:commit",
    # The second ArrayRecord twin: locally while its temporary file is written, on gs:// as its upload starts.
    "array-record-write": "shard_utils.format.array_record:write_shard:2",
    "array-record-upload": "shard_utils.format.array_record:upload:2",
    # verify --deep on gs://: once the first ArrayRecord shard is downloaded, as its reader is made.
    "verify-array-record-read": "shard_utils.format.array_record:module:2",
}


def faults(**variables: str) -> dict:
    """Environment variables that install tests/seams' faults in a process started with them (and its workers):
    kill=<KILL_AT stage>, segv=<source id>, oom=<source id>:<times>, rlimit_as=<bytes>, hold=<module:function=path>."""
    env = {"PYTHONPATH": os.pathsep.join([str(SEAMS), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    if "kill" in variables or "oom" in variables:
        if "kill" in variables:
            env["TPU_SHARDS_TEST_KILL"] = KILL_AT[variables.pop("kill")]
        counter = tempfile.NamedTemporaryFile(prefix="tpu-shards-calls-", delete=False)
        counter.close()
        env["TPU_SHARDS_TEST_COUNTER"] = counter.name
    for name, value in variables.items():
        env[f"TPU_SHARDS_TEST_{name.upper()}"] = value
    return env


def install_faults(monkeypatch, **variables: str) -> None:
    """faults() for the worker processes of a build run in this process."""
    for name, value in faults(**variables).items():
        monkeypatch.setenv(name, value)


def run_strategy_checks(*checks) -> list[dict]:
    """Run tests/strategy_check.py (8 logical CPU devices) once for several checks (each a tuple of its
    arguments): TensorFlow starts once. Returns their findings in order."""
    words = [str(w) for check in checks for w in ("+", *check)][1:]
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "strategy_check.py"), *words],
                          capture_output=True, text=True, timeout=600, cwd=REPO,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and len(lines) == len(checks), proc.stderr[-3000:]
    return [json.loads(line[len("RESULT "):]) for line in lines]


@pytest.fixture
def images(tmp_path):
    """A folder of 3 labels x 12 small JPEGs."""
    root = tmp_path / "images"
    write_images(root, {"cat": 12, "dog": 12, "fish": 12})
    return root


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory):
    """A built dataset (train 0.75 / validation 0.25, 224x224 fill) shared by read-only tests."""
    base = tmp_path_factory.mktemp("small_dataset")
    write_images(base / "images", {"cat": 30, "dog": 25, "fish": 25}, size=(80, 60))
    out = base / "out"
    run_job(base / "images", out, "--splits", "train=0.75,validation=0.25", "--image-size", "32",
            "--resize", "fill")
    return out


# The gs:// tests' storage emulator (one per session, shared by test_gcs.py and test_dataflow.py).
from gcs_fixtures import gcs  # noqa: E402,F401


def pytest_collection_modifyitems(config, items):
    """Markers for choosing a subset: `gcs` (uses the storage emulator), `tf` (imports TensorFlow) and `jax`, beside
    `slow` (over about 5 s, marked by hand). `pytest -m "not slow and not gcs and not tf"` is the fast loop."""
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if "gcs" in getattr(item, "fixturenames", ()) or "gcs" in params.values():
            item.add_marker(pytest.mark.gcs)  # the fixture, or a "gcs" case that asks for it when it runs
        module = getattr(item, "module", None)
        imported = {getattr(v, "__name__", "").split(".")[0] for v in vars(module).values()} if module else set()
        if "tensorflow" in imported:
            item.add_marker(pytest.mark.tf)
        if "jax" in imported:
            item.add_marker(pytest.mark.jax)  # a marker to choose by, not a subset: JAX starts in about a second
    items[:] = heaviest_files_first(items)


# Under `-n 2 --dist loadfile` each worker takes the next file from a queue as it runs out: the suite ends when the
# file each worker took last ends, so the queue holds the heaviest files first and the light ones last, which even
# out the two workers' ends (pytest-xdist's own order, by number of tests, queues 3 tests of 3 minutes among the last).
SLOW_TEST_WEIGHT = 10.0  # a `slow` test against a fast one: its rough cost, in fast tests


def file_weight(items) -> float:
    """A file's rough cost from its tests' markers: a slow test counts SLOW_TEST_WEIGHT, any other test one."""
    return sum(SLOW_TEST_WEIGHT if item.get_closest_marker("slow") else 1.0 for item in items)


def heaviest_files_first(items: list) -> list:
    """The items grouped by file, the files ordered by file_weight (heaviest first); a file's tests keep their
    order, and files of equal weight their collection order."""
    files: dict[str, list] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::")[0], []).append(item)
    ordered = sorted(files.values(), key=file_weight, reverse=True)  # stable: ties keep collection order
    return [item for group in ordered for item in group]


# The fast subset (`-m "not slow and not gcs and not tf"`) stays under 3 minutes on 2 cores by construction: a
# test in it that uses more CPU than FAST_TEST_CPU_S (its call and its own fixtures, its subprocesses included)
# fails, asking for the `slow` marker (one that imports TensorFlow, for the `tf` marker), and the subset's total,
# fixtures shared by several tests (module or session scope, counted once) included, is held to FAST_SUBSET_CPU_S. CPU
# time, not wall time: on cores shared with other work a test's wall time grows, its CPU time hardly does.
FAST_TEST_CPU_S = 3.0
FAST_SUBSET_CPU_S = 170.0  # one process: under 3 minutes of wall time whatever the other core does
SUBSET_MARKERS = ("slow", "gcs", "tf")
_setup_cpu = pytest.StashKey[float]()
_had_tensorflow = pytest.StashKey[bool]()
_fast_cpu: dict[str, float] = {}  # test id -> CPU seconds of its call and function-scoped fixtures
_shared = {"cpu": 0.0, "depth": 0, "fast": 0.0}  # shared fixtures: CPU so far, nesting, CPU for fast tests


def cpu_seconds() -> float:
    """CPU seconds used so far by this process (every thread) and by its children that have ended."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


_enforced = {"on": False}  # only when the fast subset itself was asked for (-m "not slow ..."); a full run reports


def in_fast_subset(item) -> bool:
    return not any(item.get_closest_marker(name) for name in SUBSET_MARKERS)


class SharedFixtureCpu:
    """A fixture shared by several tests (module or session scope) is counted once, in the subset's total, not in
    the first test's cost. A plugin registered for the whole session: a conftest's own hook would not see the
    session-scoped fixtures, which pytest sets up for the session, above this folder."""

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef):
        if fixturedef.scope == "function":
            return (yield)
        start, _shared["depth"] = cpu_seconds(), _shared["depth"] + 1
        try:
            return (yield)
        finally:
            _shared["depth"] -= 1
            if _shared["depth"] == 0:
                _shared["cpu"] += cpu_seconds() - start


def pytest_configure(config):
    config.pluginmanager.register(SharedFixtureCpu(), "tpu-shards-shared-fixture-cpu")
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist: queue the files in heaviest_files_first's order
        config.option.loadscopereorder = False
    # In a full run, threads and processes other tests leave behind (emulators, proxies, runners) add CPU to
    # whichever test runs next: the bounds hold the fast loop, where they are meant, and a full run prints them.
    _enforced["on"] = "not slow" in (config.getoption("markexpr", "") or "")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    start, shared = cpu_seconds(), _shared["cpu"]
    item.stash[_had_tensorflow] = "tensorflow" in sys.modules
    try:
        return (yield)
    finally:
        shared = _shared["cpu"] - shared
        item.stash[_setup_cpu] = cpu_seconds() - start - shared
        if in_fast_subset(item):
            _shared["fast"] += shared


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    start = cpu_seconds()
    result = yield  # a failing test raises here: its own failure is the one reported
    if in_fast_subset(item):
        if _enforced["on"] and not item.stash.get(_had_tensorflow, True) and "tensorflow" in sys.modules:
            pytest.fail("this test imports TensorFlow (seconds of CPU, whichever test does it first); mark it "
                        "@pytest.mark.tf", pytrace=False)
        spent = _fast_cpu[item.nodeid] = item.stash.get(_setup_cpu, 0.0) + cpu_seconds() - start
        if _enforced["on"] and spent > FAST_TEST_CPU_S:
            pytest.fail(f"this test used {spent:.1f} CPU seconds (its call and own fixtures), more than the fast "
                        f"subset allows ({FAST_TEST_CPU_S:g}); mark it @pytest.mark.slow", pytrace=False)
    return result


def fast_subset_cpu() -> float:
    return sum(_fast_cpu.values()) + _shared["fast"]


def hand_fast_cpu_to_controller(config) -> None:
    """Under pytest-xdist (`-n 2`, the README's full run) a worker hands its fast tests' CPU to the controller, which
    prints and holds the subset's total as one process does."""
    config.workeroutput["fast_cpu"] = json.dumps({"tests": _fast_cpu, "shared": _shared["fast"]})


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """The controller's side: a worker's fast tests join this process's count."""
    counted = json.loads(getattr(node, "workeroutput", {}).get("fast_cpu", "null") or "null")
    if counted:
        _fast_cpu.update(counted["tests"])
        _shared["fast"] += counted["shared"]


def pytest_terminal_summary(terminalreporter):
    if _fast_cpu:
        top = sorted(_fast_cpu.items(), key=lambda kv: -kv[1])[:5]
        terminalreporter.write_line(
            f"fast subset: {len(_fast_cpu)} tests used {fast_subset_cpu():.1f} CPU seconds, shared fixtures "
            f"{_shared['fast']:.1f} of them (at most {FAST_SUBSET_CPU_S:g}); most: " +
            ", ".join(f"{name.split('::')[-1][:50]} {cpu:.1f}" for name, cpu in top))


def pytest_sessionfinish(session):
    if hasattr(session.config, "workeroutput"):  # an xdist worker: the controller adds up and holds the total
        hand_fast_cpu_to_controller(session.config)
        return
    if _enforced["on"] and fast_subset_cpu() > FAST_SUBSET_CPU_S:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED  # the summary above says why
