"""Real multi-host JAX on this machine: 2 and 4 processes (`jax.distributed.initialize` on 127.0.0.1, CPU devices)
read one dataset through `make_iterator`, each record once per epoch across processes and every evaluation record
once; then all of them are SIGKILLed mid-epoch and the run resumes on another process count from the input state
Orbax saved, every epoch still trained on exactly once. Each process logs the rows it held (tests/jax_host.py)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field

import numpy as np
import pytest
from conftest import REPO
from jax_host import fingerprint
from kill_runs import assert_epochs_exactly_once

from shard_utils.read import epochs
from shard_utils.read.random_access import Decoder, RandomAccessSource

pytestmark = [pytest.mark.slow, pytest.mark.jax]

SEED, GLOBAL = 5, 8
DEVICES = 8  # over all processes, unless a test says otherwise


def reference(dataset, split: str) -> list[str]:
    """The fingerprint of every record of a split, in index order, as a process fingerprints its rows."""
    source = RandomAccessSource(str(dataset), split)
    decode = Decoder.for_manifest(source.manifest)
    return [fingerprint(decode(source[i])["image"].astype(np.float32) * np.float32(1 / 255))
            for i in range(len(source))]


@dataclass
class Piece:
    """What the processes of one run logged: the step it started at, and per global step the rows they held."""

    returncodes: list[int]
    start: int = -1
    steps: dict[int, dict[int, str]] = field(default_factory=dict)
    saved: list[int] = field(default_factory=list)
    evals: list[dict[int, tuple[str, float]]] = field(default_factory=list)
    stderr: str = ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_processes(dataset, tmp_path, name: str, processes: int, *, steps: int, kill_at: int | None = None,
                  devices: int = DEVICES, evaluate: bool = False) -> Piece:
    """Start `processes` JAX processes (one process group) and wait for them; with `kill_at`, SIGKILL the whole
    group once process 0 has trained global step `kill_at`."""
    port, logs = free_port(), [tmp_path / f"{name}-{i}.log" for i in range(processes)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    procs: list[subprocess.Popen] = []
    errors = [open(tmp_path / f"{name}-{i}.err", "w") for i in range(processes)]
    for i in range(processes):
        command = [sys.executable, str(REPO / "tests" / "jax_host.py"), str(dataset), "--port", str(port),
                   "--processes", str(processes), "--process-id", str(i), "--devices", str(devices // processes),
                   "--global-batch", str(GLOBAL), "--steps", str(steps), "--save-every", "2", "--seed", str(SEED),
                   "--log", str(logs[i]), "--ckpt", str(tmp_path / "ckpt"), *(["--eval"] if evaluate else [])]
        group = procs[0].pid if procs else 0  # one process group (the first one's), killed as one
        procs.append(subprocess.Popen(command, stdout=subprocess.PIPE if i == 0 else subprocess.DEVNULL,
                                      stderr=errors[i], text=True, env=env,
                                      process_group=group))
    try:
        for line in procs[0].stdout:  # the group killed: process 0's pipe closes and the loop ends
            words = line.split()
            if kill_at is not None and words[:1] == ["STEP"] and int(words[1]) >= kill_at:
                os.killpg(procs[0].pid, signal.SIGKILL)
        codes = [p.wait(timeout=300) for p in procs]
    finally:
        if any(p.poll() is None for p in procs):
            os.killpg(procs[0].pid, signal.SIGKILL)
        for f in errors:
            f.close()
    piece = Piece(codes, stderr="".join((tmp_path / f"{name}-{i}.err").read_text()[-1500:] for i in range(processes)))
    for log in logs:
        evals = 0
        for line in log.read_text().splitlines() if log.exists() else []:
            words = line.split()
            if words[0] == "START":
                assert piece.start in (-1, int(words[1]))  # every process resumed at the same step
                piece.start = int(words[1])
            elif words[0] == "STEP":
                held = piece.steps.setdefault(int(words[1]), {})
                for row, fp in (w.split(":") for w in words[2:]):
                    assert held.setdefault(int(row), fp) == fp  # two processes holding a row hold the same record
            elif words[0] == "SAVED":
                piece.saved.append(int(words[1]))
            elif words[0] == "EVAL":
                while len(piece.evals) <= evals:
                    piece.evals.append({})
                for row, fp, mask in (w.split(":") for w in words[1:]):
                    piece.evals[evals][int(row)] = (fp, float(mask))
                evals += 1
    return piece


def stream_of(pieces: list[Piece], total: int) -> list[str]:
    """The records trained on in the end, in stream order: a piece's steps from its successor's start on were lost
    with it; every kept step was held whole (all GLOBAL rows) by the processes of its piece."""
    kept: dict[int, dict[int, str]] = {}
    for i, piece in enumerate(pieces):
        end = pieces[i + 1].start if i + 1 < len(pieces) else total
        if i + 1 < len(pieces):
            assert set(piece.returncodes) == {-signal.SIGKILL}, piece.stderr
            assert max([piece.start, *piece.saved]) <= end <= max(piece.steps) + 1, (piece.saved, end)
        for k in range(piece.start, end):
            kept[k] = piece.steps[k]
    assert pieces[-1].returncodes == [0] * len(pieces[-1].returncodes), pieces[-1].stderr
    assert sorted(kept) == list(range(total))
    assert all(sorted(rows) == list(range(GLOBAL)) for rows in kept.values())
    return [kept[k][r] for k in range(total) for r in range(GLOBAL)]


@pytest.mark.parametrize("processes", [2, 4])
def test_processes_share_each_global_step_and_read_each_record_once_per_epoch(small_dataset, tmp_path, processes):
    train, validation = reference(small_dataset, "train"), reference(small_dataset, "validation")
    total = len(train) // GLOBAL + 1  # the whole first epoch, and the start of the second
    piece = run_processes(small_dataset, tmp_path, "run", processes, steps=total, evaluate=True)
    stream = stream_of([piece], total)
    expected = [train[r] for k in range(total) for r in epochs.batch_rows(SEED, len(train), GLOBAL, k)]
    assert stream == expected
    assert sorted(stream[:len(train)]) == sorted(train)
    rows = [row for batch in piece.evals for row in sorted(batch.items())]
    assert all(sorted(batch) == list(range(GLOBAL)) for batch in piece.evals)
    assert [fp for _, (fp, mask) in rows if mask] == validation  # every record once, in index order
    assert [mask for _, (_, mask) in rows] == [1.0] * len(validation) + [0.0] * (len(rows) - len(validation))


def test_all_processes_killed_mid_epoch_resume_on_another_process_count_each_epoch_once(small_dataset, tmp_path):
    train = reference(small_dataset, "train")
    total = 2 * len(train) // GLOBAL + 1  # two whole epochs and the start of a third
    pieces = [run_processes(small_dataset, tmp_path, "four", 4, steps=total, kill_at=4)]
    pieces.append(run_processes(small_dataset, tmp_path, "two", 2, steps=total, devices=4))
    assert 0 < pieces[1].start < total
    stream = stream_of(pieces, total)
    assert stream == [train[r] for k in range(total) for r in epochs.batch_rows(SEED, len(train), GLOBAL, k)]
    assert_epochs_exactly_once(stream, train)
