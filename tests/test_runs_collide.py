"""Runs that collide or are interrupted: a live build's output is refused to a second build, a run only
ever touches its own temporary folder, and Ctrl-C always ends in one line, exit 130, no orphans."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, faults, run_cli, write_images
from readers import dataset_files, shard_bytes

from beam_jobs.run import claim
from shard_utils import storage
from shard_utils.read.verify import verify
from shard_utils.storage import lock as runlock


def start_build(*args, env=None) -> subprocess.Popen:
    full_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "beam_jobs.cli", "build", *map(str, args)], cwd=REPO,
                            env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def wait_for_lock(output: str, timeout: float = 60) -> runlock.Lease:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = storage.read_versioned(runlock.lock_path(output))
        if found:
            return runlock.Lease.from_bytes(found[0])
        time.sleep(0.05)
    raise AssertionError("the first build never took the lock")


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until path exists (the process reached a held step); fails if the process ends first."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"the build never reached its held step: {proc.communicate()[1][-2000:]}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    root = tmp_path_factory.mktemp("collide") / "in"
    write_images(root, {"a": 20, "b": 20})
    return root


@pytest.mark.slow
@pytest.mark.parametrize("where", ["local", "gcs"])
def test_a_second_build_into_a_live_output_is_refused_and_the_first_completes(request, photos, tmp_path, where):
    if where == "local":
        out = str(tmp_path / "out")
    else:
        gcs = request.getfixturevalue("gcs")
        out = f"gs://{gcs.new_bucket('collide')}/ds"
    hold = tmp_path / "release"
    first = start_build("--input", photos, "--output", out,
                        env=faults(hold=f"shard_utils.sharding.writer:write_shard={hold}"))
    wait_for(Path(f"{hold}.reached"), first)  # the first build is writing shards, and waits
    lease = wait_for_lock(out)
    second = run_cli("build", "--input", photos, "--output", out, "--overwrite")
    hold.touch()
    assert second.returncode == 2
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and "is being written by another build" in lines[0] and lease.run_id in lines[0]
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    assert verify(out) == []
    assert not storage.exists(runlock.lock_path(out))


@pytest.mark.slow
def test_a_build_removes_only_dead_runs_temporary_folders(photos, tmp_path):
    out = tmp_path / "out"
    stale = out / claim.TEMP_ROOT / "20200101T000000-deadbeef" / "fragments"
    stale.mkdir(parents=True)
    (stale / "x.records").write_bytes(b"left by a crashed run")
    done = run_cli("build", "--input", photos, "--output", out)
    assert done.returncode == 0, done.stderr  # only the job's own bookkeeping was there: not "not empty"
    assert not (out / claim.TEMP_ROOT).exists()
    assert sorted(p.name for p in out.iterdir()) == sorted([*shard_bytes(out), *dataset_files()])


def processes_tagged(tag: str) -> list[int]:
    """Processes whose environment carries this tag (the build and its encode workers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if tag.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


@pytest.mark.slow
def test_ctrl_c_at_random_moments_gives_one_line_exit_130_and_no_orphans(tmp_path):
    src = tmp_path / "in"
    write_images(src, {"a": 150, "b": 150}, size=(160, 120))
    out = tmp_path / "out"
    assert run_cli("build", "--input", src, "--output", out, "--image-size", "64").returncode == 0
    rng = random.Random(7)
    outcomes = []
    for attempt in range(5):
        tag = f"tpu-shards-ctrl-c-{os.getpid()}-{attempt}"
        proc = start_build("--input", src, "--output", out, "--overwrite", "--image-size", "64", "--workers", "2",
                           env={"TPU_SHARDS_TEST_TAG": tag})
        time.sleep(rng.uniform(0.3, 4.0))  # a build of these images takes about 3 s: most moments interrupt it
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        started = time.monotonic()
        _, err = proc.communicate(timeout=60)
        assert time.monotonic() - started < 30, "the build hung after Ctrl-C"
        if proc.returncode == 0:
            outcomes.append("finished")
        else:
            lines = [line for line in err.splitlines() if line.strip()]
            assert proc.returncode == 130 and len(lines) == 1 and lines[0].startswith("tpu-shards: interrupted; "), err
            outcomes.append(lines[0])
        deadline = time.monotonic() + 10
        while processes_tagged(tag) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert processes_tagged(tag) == [], "encode workers outlived the build"
        if (out / "manifest.json").exists():
            assert verify(str(out)) == []
        assert not storage.exists(runlock.lock_path(str(out)))
    assert any(o != "finished" for o in outcomes)
