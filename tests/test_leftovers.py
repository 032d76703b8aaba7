"""No leftovers after a full disk: a run file whose writing fails is removed with its temporary file and its
metadata, whichever write the disk refused. The file-size limit (RLIMIT_FSIZE) makes writes fail in the kernel
as a full disk does, without a filesystem of our own."""
from __future__ import annotations

import json
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, write_images

_ENCODE_RUN = """
import json, sys
from pathlib import Path
from shard_utils.inputs import MediaItem
from shard_utils.media.encode import EncodeSettings
from shard_utils.sharding.encode_run import RunTask, encode_run
src, temp = Path(sys.argv[1]), sys.argv[2]
items = tuple(MediaItem(f"a/{p.name}", str(p), p.stat().st_size, ("a",)) for p in sorted(src.glob("a/*.jpg")))
try:
    encode_run(RunTask("train", 7, items), EncodeSettings(label_ids={"a": 0}), temp)
    print(json.dumps({"ok": True}))
except Exception as exc:
    print(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}))
"""


def _limit_file_size(limit: int):
    def preexec():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return preexec


@pytest.mark.parametrize("limit", [20_000, 100_000])  # the disk fills early, or late in the run
def test_a_run_whose_disk_fills_leaves_no_file(tmp_path, limit):
    write_images(tmp_path / "in", {"a": 40}, size=(96, 64))
    temp = tmp_path / "temp"
    done = subprocess.run([sys.executable, "-c", _ENCODE_RUN, str(tmp_path / "in"), str(temp)], capture_output=True,
                          text=True, timeout=120, cwd=REPO, preexec_fn=_limit_file_size(limit),
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    outcome = json.loads(done.stdout)
    assert outcome["ok"] is False and "File too large" in outcome["error"], outcome
    assert [p.name for p in (temp / "runs" / "train").iterdir()] == []


@pytest.mark.slow
def test_a_reshard_that_fails_before_its_manifest_leaves_an_empty_output(tmp_path):
    """Held once its shards are in the output, then denied its manifest (a folder in its place): it fails in
    one line, and the output holds no shard or index without a manifest, as a run failing earlier leaves none."""
    import os
    import time

    from conftest import faults
    from hostile import build_valid

    source = build_valid(tmp_path / "valid")
    out, hold = tmp_path / "out", tmp_path / "hold"
    proc = subprocess.Popen([sys.executable, "-m", "beam_jobs.cli", "reshard", str(source), str(out)], cwd=REPO,
                            env={**os.environ, **faults(hold=f"beam_jobs.publish.steps:commit={hold}")},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not Path(f"{hold}.reached").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-2000:]
        time.sleep(0.05)
    assert any(p.name.endswith(".tfrecord") for p in out.iterdir())
    (out / "manifest.json").mkdir()
    hold.touch()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err[-2000:]
    assert err.strip().startswith("tpu-shards: error:") and len(err.strip().splitlines()) == 1, err
    # and the run folder
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["manifest.json"]
