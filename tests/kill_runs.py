"""Run a training script in a subprocess, SIGKILL it once it has logged a chosen step, and read what it did.

The scripts print `START k` (the step they resumed at), `STEP k <source ids>` (or `BATCH k`) per trained step,
`SAVED k` after each checkpoint, and at the end `EVAL <ids>` / `MODEL <counts>`; see examples/resume_*.py.
"""
from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

from conftest import REPO


@dataclass
class Piece:
    """What one run of the script printed before it ended or was killed."""

    returncode: int
    start: int
    steps: dict[int, list[str]] = field(default_factory=dict)
    saved: list[int] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    stderr: str = ""

    def last(self, tag: str) -> list[str]:
        """The words after `tag` on its last line ([] if never printed)."""
        found = [line.split()[1:] for line in self.lines if line.split()[:1] == [tag]]
        return found[-1] if found else []


def run(script: str, *args, kill_after: int | None = None, timeout: float = 600, untuned: bool = False) -> Piece:
    """Run examples/<script> with args; with `kill_after=n`, SIGKILL it once it logs a step >= its start + n.
    `untuned`: a Keras script under a strategy, its per-replica datasets without autotuning (untuned_replicas.py):
    the same steps, without waiting on TensorFlow's threads at every validation."""
    wrapper = [str(REPO / "tests" / "untuned_replicas.py")] if untuned else []
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, *wrapper, str(REPO / "examples" / script), *map(str, args)], cwd=REPO,
                                stdout=subprocess.PIPE, stderr=err, text=True,
                                env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"},
                                start_new_session=True)  # killed as a group: no child keeps the pipe open
        piece, killed = Piece(returncode=0, start=-1), False
        for line in proc.stdout:  # after the kill, on to the end: what it printed before dying is still in the pipe
            piece.lines.append(line.rstrip("\n"))
            words = line.split()
            if words[:1] == ["START"]:
                piece.start = int(words[1])
            elif words[:1] in (["STEP"], ["BATCH"]):
                piece.steps[int(words[1])] = words[2:]
                if kill_after is not None and not killed and int(words[1]) >= piece.start + kill_after:
                    os.killpg(proc.pid, signal.SIGKILL)  # a loaded reader may be steps behind the loop it kills
                    killed = True
            elif words[:1] == ["SAVED"]:
                piece.saved.append(int(words[1]))
        proc.stdout.close()
        piece.returncode = proc.wait(timeout=timeout)
        err.seek(0)
        piece.stderr = err.read()[-3000:]
    return piece


def effective_steps(pieces: list[Piece], total: int) -> list[list[str]]:
    """The records each step trained on in the end: a piece's steps past its successor's start were lost with it.

    Checks that each piece resumed at a checkpoint its predecessor wrote (never before it, never past what it
    trained), and that a step run twice, on any pipeline count, held the same records both times."""
    logged: dict[int, list[str]] = {}
    for before, after in itertools.pairwise(pieces):
        assert before.returncode == -signal.SIGKILL, before.stderr
        assert max([before.start, *before.saved]) <= after.start <= max(before.steps) + 1, (before.saved, after.start)
    for piece in pieces:
        for k, ids in piece.steps.items():
            assert logged.get(k, ids) == ids, f"step {k} held other records when run again"
            logged[k] = ids
    assert pieces[-1].returncode == 0, pieces[-1].stderr
    assert sorted(logged) == list(range(total))
    return [logged[k] for k in range(total)]


def assert_epochs_exactly_once(stream: list[str], every: list[str]) -> None:
    """Each whole epoch of the trained stream is every record once; consecutive epochs differ in order."""
    n = len(every)
    epochs = [stream[e * n:(e + 1) * n] for e in range(len(stream) // n)]
    assert len(epochs) >= 2
    for epoch in epochs:
        assert sorted(epoch) == sorted(every)
    assert all(a != b for a, b in itertools.pairwise(epochs))
    assert len(set(stream[len(epochs) * n:])) == len(stream) - len(epochs) * n  # the partial epoch: no repeats

