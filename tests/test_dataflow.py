"""The Dataflow path without a cloud: a classic template built offline against the storage emulator.

Building a template runs everything the Dataflow runner does before a job is submitted: the
driver's preflight on the buckets, graph construction, pickling, and staging of the package
(an sdist of setup.py) and the pipeline to --temp_location, here a bucket on the emulator.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest
from conftest import REPO, faults, write_images

from beam_jobs.errors import UsageError
from beam_jobs.jobs.build import run
from beam_jobs.run import claim
from shard_utils import storage
from shard_utils.format import manifest
from shard_utils.storage import lock as runlock

STEPS = {"StartRun", "ListMedia", "ShardMedia", "Publish"}


def dataflow_args(tmp_bucket: str, template: str) -> list[str]:
    return ["--runner", "DataflowRunner", "--project", "local-emulator", "--region", "us-central1",
            "--temp_location", f"gs://{tmp_bucket}/tmp", "--template_location", template,
            "--setup_file", str(REPO / "setup.py")]


def read_gs(em, uri: str) -> bytes:
    bucket, name = storage.split_gcs(uri)
    return em.client.bucket(bucket).blob(name).download_as_bytes()


def test_dataflow_template_lists_the_steps_and_stages_the_package(gcs, tmp_path):
    write_images(tmp_path / "images", {"cat": 3, "dog": 3}, size=(32, 24))
    raw, out, tmp = gcs.new_bucket("df-raw"), gcs.new_bucket("df-out"), gcs.new_bucket("df-tmp")
    gcs.upload_tree(tmp_path / "images", raw, "photos")
    template = tmp_path / "template.json"

    done = subprocess.run(
        [sys.executable, "-m", "beam_jobs.build_shards", "--input", f"gs://{raw}/photos", "--output", f"gs://{out}/ds",
         "--num-cores", "2", *dataflow_args(tmp, str(template))],
        capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"tpu-shards: Dataflow template written to {template}" in done.stdout
    assert gcs.names(out) == []  # the preflight probed the output and left nothing; no job ran

    spec = json.loads(template.read_text())
    options = spec["environment"]["sdkPipelineOptions"]["options"]
    assert options["project"] == "local-emulator" and options["region"] == "us-central1"
    assert options["setup_file"] == str(REPO / "setup.py")

    # The pipeline's steps, from the pipeline proto the template points at.
    from apache_beam.portability.api import beam_runner_api_pb2

    assert options["pipelineUrl"].startswith(f"gs://{tmp}/tmp/")
    pipeline = beam_runner_api_pb2.Pipeline.FromString(read_gs(gcs, options["pipelineUrl"]))
    names = {t.unique_name for t in pipeline.components.transforms.values()}
    assert STEPS <= names
    assert {"StartRun/Stable", "StartRun/TakeLock", "StartRun/KeepLease", "ListMedia/List1", "ShardMedia/PlanLayout",
            "ShardMedia/EncodeRuns/Encode", "ShardMedia/PlanShards", "ShardMedia/WriteShards/Copy",
            "ShardMedia/WriteShards/Take", "Publish/Move", "Publish/MergeIndex", "Publish/Commit"} <= names

    # The package staged for the workers: an sdist of this project, built from setup.py.
    packages = {p["name"]: p["location"] for p in spec["environment"]["workerPools"][0]["packages"]}
    assert "workflow.tar.gz" in packages
    staged = packages["workflow.tar.gz"].replace("storage.googleapis.com/", "gs://", 1)
    assert staged.startswith(f"gs://{tmp}/tmp/")
    sdist = tmp_path / "workflow.tar.gz"
    sdist.write_bytes(read_gs(gcs, staged))
    with tarfile.open(sdist) as tar:
        members = {m.name.split("/", 1)[1] for m in tar.getmembers() if "/" in m.name}
        requires = tar.extractfile(next(m for m in tar.getmembers() if m.name.endswith("requires.txt"))).read()
    assert {"setup.py", "beam_jobs/build_shards.py", "beam_jobs/pipeline/encode.py", "shard_utils/storage/__init__.py",
            "shard_utils/format/tfrecord.py"} <= members
    assert not any(m.startswith("tests/") for m in members)
    assert b"apache-beam[gcp]" in requires and b"tensorflow" not in requires.split(b"[")[0]
    assert sdist.stat().st_size < 500_000  # the code and three copies of the README (README, PKG-INFO x2)

    # No credential ends up in the template or the job's output.
    text = template.read_text() + done.stdout + done.stderr
    for secret in gcs.tokens.secrets():
        assert secret not in text


def test_template_can_be_written_to_a_bucket_and_run_returns_none(gcs, tmp_path):
    write_images(tmp_path / "images", {"cat": 2, "dog": 2}, size=(32, 24))
    raw, out, tmp = gcs.new_bucket("df-raw"), gcs.new_bucket("df-out"), gcs.new_bucket("df-tmp")
    gcs.upload_tree(tmp_path / "images", raw, "photos")
    template = f"gs://{tmp}/templates/tpu-shards.json"
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        result = run(["--input", f"gs://{raw}/photos", "--output", f"gs://{out}/ds", *dataflow_args(tmp, template)])
    assert result is None
    assert f"template written to {template}" in printed.getvalue()
    spec = json.loads(read_gs(gcs, template))
    assert spec["type"] == "JOB_TYPE_BATCH"
    assert gcs.names(out) == []


def test_interrupted_wait_does_not_delete_a_running_jobs_temporary_objects():
    from apache_beam.runners.runner import PipelineResult, PipelineState

    from beam_jobs.jobs.running import still_running

    assert still_running(PipelineResult(PipelineState.RUNNING))  # Ctrl-C while Dataflow works on
    assert not still_running(PipelineResult(PipelineState.FAILED))
    assert not still_running(PipelineResult(PipelineState.DONE))
    assert not still_running(None)  # the local runner had returned or raised


def test_each_template_launch_decides_its_own_run_and_a_retry_of_its_lock_step_reuses_it(tmp_path):
    """A template has no driver: the job decides its run when it runs (made stable before the lock is taken),
    takes the output's lock and applies the --overwrite rule. Taking the lock again for the same run (a retried
    step) succeeds; another launch's run is refused while the first holds the lock."""
    from dataclasses import replace

    from beam_jobs.pipeline.start import decide_run, take_lock
    from beam_jobs.run.config import BuildConfig

    out = tmp_path / "out"
    config = BuildConfig(input=str(tmp_path / "in"), output=str(out), temp_root=str(out / claim.TEMP_ROOT))
    first = take_lock(decide_run(config), config)
    assert first.temp_dir == str(out / claim.TEMP_ROOT / first.run_id) and first.created
    assert runlock.holds(str(out), first.run_id)
    assert take_lock(first, config) == first  # the lock step retried, or run twice at once
    with pytest.raises(UsageError, match=f"being written by another build: run {first.run_id}"):
        take_lock(decide_run(config), config)  # a second launch while the first runs
    runlock.release(str(out), first.run_id)
    second = take_lock(decide_run(config), config)
    assert second.run_id != first.run_id and second.temp_dir != first.temp_dir
    runlock.release(str(out), second.run_id)
    (out / "train-00000-of-00008.tfrecord").write_bytes(b"a dataset is here")
    with pytest.raises(UsageError, match="pass --overwrite"):
        take_lock(decide_run(config), config)
    assert not (out / runlock.LOCK_NAME).exists()  # refused launches leave no lock behind
    third = take_lock(decide_run(config), replace(config, overwrite=True))
    assert runlock.holds(str(out), third.run_id)


def run_bounded(job, seconds: float) -> list[BaseException]:
    """Run job() in a thread for at most `seconds`; the exceptions it raised. Fails if it is still running."""
    failed: list[BaseException] = []

    def target():
        try:
            job()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            failed.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s"
    return failed


@pytest.mark.slow
def test_a_template_launch_runs_to_the_end_and_publishes(tmp_path):
    """The graph of a template launch (run decided inside the job) on the in-process runner, which runs one bundle
    at a time: no step waits on the lease's renewals, so the run's side input is complete once the lock is taken,
    and the job publishes and gives the lock back."""
    from template_job import run_template_job, template_config

    write_images(tmp_path / "in", {"cat": 3, "dog": 3}, size=(32, 24))
    out = tmp_path / "out"
    config = template_config(tmp_path / "in", out, lease_seconds=2.0)
    assert run_bounded(lambda: run_template_job(config), 120) == []
    built = manifest.load(str(out))
    assert built.num_records("train") == 6 and len(list(out.glob("train-*.tfrecord"))) == 2
    assert not (out / runlock.LOCK_NAME).exists() and not (out / claim.TEMP_ROOT).exists()


def lease_of(output: Path) -> runlock.Lease | None:
    path = output / runlock.LOCK_NAME
    return runlock.Lease.from_bytes(path.read_bytes()) if path.exists() else None


def wait_for(condition, seconds: float, what: str):
    """Poll condition() until it is true (returned), failing after `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {seconds} s")


@pytest.mark.slow
def test_a_killed_template_launch_leaves_a_lease_that_runs_out(tmp_path):
    """A template-mode job held in WriteShards renews its lease from the job's own processes (the step does not);
    SIGKILLed there, nothing renews it any more. Its workers are on another host (as on Dataflow), so the next
    build is refused until the lease has run out, then takes the output and publishes."""
    from template_job import run_template_job, template_config

    from beam_jobs.pipeline.start import decide_run, take_lock

    write_images(tmp_path / "in", {"cat": 3, "dog": 3}, size=(32, 24))
    out, held, lease_seconds = tmp_path / "out", tmp_path / "go", 4.0
    env = {**os.environ, **faults(hold=f"shard_utils.sharding.writer:write_shard={held}"),
           "TPU_SHARDS_TEST_HOSTNAME": "dataflow-worker-0"}
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(REPO)])
    with open(tmp_path / "job.err", "w") as err:
        job = subprocess.Popen([sys.executable, str(REPO / "tests" / "template_job.py"), str(tmp_path / "in"),
                                str(out), str(lease_seconds)], env=env, stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait_for(lambda: Path(f"{held}.reached").exists() or job.poll() is not None, 120,
                 "the job reaching WriteShards")
        assert job.poll() is None, (tmp_path / "job.err").read_text()[-3000:]
        first = lease_of(out)
        assert first is not None and first.host == "dataflow-worker-0"
        wait_for(lambda: lease_of(out).expires > first.expires, 30, "a renewal while the step is held")
    finally:
        job.kill()
        job.wait(30)
    last = (out / runlock.LOCK_NAME).read_bytes()
    expires = runlock.Lease.from_bytes(last).expires
    config = template_config(tmp_path / "in", out)
    with pytest.raises(UsageError, match=f"being written by another build: run {first.run_id}"):
        take_lock(decide_run(config), config)  # the lease still counts: its holder may be alive elsewhere
    wait_for(lambda: time.time() > expires, lease_seconds + 5, "the lease running out")
    assert (out / runlock.LOCK_NAME).read_bytes() == last  # nothing renewed it after the kill
    assert run_bounded(lambda: run_template_job(config), 120) == []
    built = manifest.load(str(out))
    assert built.num_records("train") == 6 and built.created != first.started
    assert not (out / runlock.LOCK_NAME).exists()
    assert not (out / claim.TEMP_ROOT / first.run_id).exists()  # the killed run's temporary files are gone
