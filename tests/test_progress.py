"""Build progress: bars on a terminal only (or when forced), safe from threads, silent elsewhere; and the
counter lines printed while a Dataflow job runs, formatted from a real pipeline result's metrics."""
from __future__ import annotations

import fcntl
import io
import multiprocessing
import os
import pty
import struct
import subprocess
import sys
import termios
import threading

import pytest
from conftest import REPO

from beam_jobs import progress

DRIVER = """
import sys
from beam_jobs import progress
shown = progress.start({"auto": None, "on": True, "off": False}[sys.argv[1]])
for _ in range(30):
    progress.advance("list")
    progress.expect("encode")
for _ in range(30):
    progress.advance("encode")
progress.total("write", 30)
progress.advance("write", 30)
print("shown", shown, sorted(progress.counts().items()), flush=True)
progress.stop()
"""


def run_driver(mode: str, terminal: bool, size: tuple[int, int] | None = (100, 30)) -> tuple[str, str]:
    """Run the driver script with stderr on a pipe or a pseudo-terminal of size (columns, rows); returns
    (stdout, stderr)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "100"}
    if not terminal:
        done = subprocess.run([sys.executable, "-c", DRIVER, mode], capture_output=True, text=True, env=env,
                              cwd=REPO, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout, done.stderr
    leader, follower = pty.openpty()
    if size is not None:
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", size[1], size[0], 0, 0))
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, mode], stdout=subprocess.PIPE, stderr=follower,
                            env=env, cwd=REPO, text=True)
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    out = proc.stdout.read()
    assert proc.wait(60) == 0
    return out, b"".join(chunks).decode("utf-8", "replace")


@pytest.mark.parametrize("size", [(100, 30), (0, 0)], ids=["100x30", "terminal without a size"])
def test_bars_on_a_terminal(size):
    out, err = run_driver("auto", terminal=True, size=size)
    assert "shown True" in out
    assert "[('encode', (30, 30)), ('list', (30, None)), ('write', (30, 30))]" in out
    for phase, unit in (("listing", "files"), ("encoding", "images"), ("writing", "records")):
        assert phase in err and "30/30 [" in err and f" {unit}/s" in err
    assert "100%" in err  # totals known: percentage, rate and ETA


def test_silent_in_a_pipe_and_when_turned_off():
    out, err = run_driver("auto", terminal=False)
    assert out.strip() == "shown False []" and err == ""
    out, err = run_driver("off", terminal=True)
    assert out.strip() == "shown False []" and err == ""


def test_forced_on_in_a_pipe():
    out, err = run_driver("on", terminal=False)
    assert "shown True" in out and "encoding" in err and "30/30" in err


def test_threads_add_up_and_other_processes_stay_silent():
    stream = io.StringIO()
    with progress.showing(True, stream):
        def work():
            for _ in range(500):
                progress.expect("encode")
                progress.advance("encode")

        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert progress.counts() == {"encode": (4000, 4000)}
        with pytest.raises(ValueError, match="unknown progress phase"):
            progress.advance("decode")
        # A forked worker (Beam's multi-process mode, a pool) inherits the module state but draws nothing.
        with multiprocessing.get_context("fork").Pool(1) as pool:
            assert pool.apply(_advance_in_child) == {}
    assert progress.counts() == {}  # stopped: calls are no-ops again
    progress.advance("encode")
    assert "4000/4000" in stream.getvalue()


def _advance_in_child():
    progress.advance("encode", 5)
    return progress.counts()


def test_dataflow_counter_lines_from_a_real_pipeline_result():
    import apache_beam as beam
    from apache_beam.metrics import Metrics
    from apache_beam.options.pipeline_options import PipelineOptions

    def count(x):
        Metrics.counter("tpu_shards", "files_matched").inc()
        if x % 4 == 0:
            Metrics.counter("tpu_shards", "rejected_corrupt" if x else "rejected_empty").inc()
        else:
            Metrics.counter("tpu_shards", "images_reencoded").inc()
            Metrics.counter("tpu_shards", "images_written").inc()
        if x == 5:
            Metrics.counter("tpu_shards", "skipped_hidden").inc(2)
        return x

    pipeline = beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"]))
    _ = pipeline | beam.Create(range(10)) | beam.Map(count)
    result = pipeline.run()
    result.wait_until_finish()

    totals = progress.counter_totals(result)
    assert totals == {"files_matched": 10, "rejected_empty": 1, "rejected_corrupt": 2, "images_reencoded": 7,
                      "images_written": 7, "skipped_hidden": 2}
    assert progress.counter_line(totals, "RUNNING", 75.4) == (
        "tpu-shards: RUNNING after 1m15s: files_matched 10, images_encoded 7, images_written 7, shards_written 0, "
        "rejected 3 (corrupt 2, empty 1), skipped 2")
    out = io.StringIO()
    assert progress.watch(result, interval=0.01, out=out) == "DONE"
    (line,) = out.getvalue().splitlines()  # no job id on the local runner: no console URL, one final line
    assert line.startswith("tpu-shards: DONE after 0m0") and line.endswith("rejected 3 (corrupt 2, empty 1), skipped 2")


def test_console_url():
    assert progress.console_url("2026-01-02_03_04_05-123", "europe-west4", "my-proj") == (
        "https://console.cloud.google.com/dataflow/jobs/europe-west4/2026-01-02_03_04_05-123?project=my-proj")


@pytest.mark.slow
def test_bars_show_on_a_terminal_with_the_base_install_alone(tmp_path):
    """Progress is a default feature: a build on a terminal shows its bars with only the packages that
    `pip install tpu-shards` (no extras) brings."""
    from base_install import base_install_environment
    from conftest import write_images
    from terminal import run_in_terminal

    env = {**base_install_environment(tmp_path / "site"), "COLUMNS": "100"}
    probe = subprocess.run([sys.executable, "-c", "import matplotlib"], env=env, cwd=REPO, capture_output=True,
                           text=True)
    assert "No module named 'matplotlib'" in probe.stderr  # the extras' packages are out of reach
    write_images(tmp_path / "in", {"a": 6, "b": 6})
    code, text = run_in_terminal([sys.executable, "-m", "beam_jobs.cli", "build", "--input", str(tmp_path / "in"),
                                  "--output", str(tmp_path / "out"), "--num-cores", "2"], cwd=REPO, env=env)
    assert code == 0, text
    assert "encoding : 100%" in text and "writing  : 100%" in text and "12/12" in text


def test_listing_counts_files_as_they_are_listed_not_when_the_listing_ends(tmp_path):
    """A big folder's listing shows its progress chunk by chunk: after the first chunk comes out, the bar
    already counts it, while the rest of the folder is still to be walked."""
    from beam_jobs.pipeline import listing
    from beam_jobs.pipeline.listing import ListTask, list_task
    from beam_jobs.run.config import BuildConfig

    for i in range(listing.LIST_CHUNK * 2 + 5):
        (tmp_path / f"{i:05d}.jpg").write_bytes(b"x")
    config = BuildConfig(input=str(tmp_path), output=str(tmp_path / "out"), temp_root=str(tmp_path / "tmp"))
    with progress.showing(True, io.StringIO()):
        assert progress.counts() == {}
        outputs = list_task(ListTask(""), config, True)
        first = next(outputs)
        assert progress.counts() == {"list": (len(first), None)}
        rest = list(outputs)
        assert progress.counts() == {"list": (len(first) + sum(len(c) for c in rest), None)}
        assert progress.counts()["list"][0] == listing.LIST_CHUNK * 2 + 5
