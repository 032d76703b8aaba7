"""Training loops killed with SIGKILL at random steps and resumed on the same, fewer and more input pipelines:
every epoch is trained on exactly once across the pieces, the next epoch in a new order, the model counts each
trained record once, and evaluation sees every validation record once."""
from __future__ import annotations

import random

import numpy as np
import pytest
from kill_runs import assert_epochs_exactly_once, effective_steps, run

from shard_utils.format.index import read_index
from shard_utils.format.manifest import load

pytestmark = pytest.mark.slow


def split_rows(dataset, split: str) -> dict[str, int]:
    """source id -> label of every record of a split, from its index."""
    m = load(str(dataset))
    with open(dataset / m.split(split).index.path, "rb") as f:
        return {row.source_id: row.label for row in read_index(f)}


@pytest.mark.parametrize("loader", ["tf", "grain"])
def test_a_loop_killed_and_resumed_on_4_4_2_then_8_hosts_trains_each_epoch_once(small_dataset, tmp_path, loader):
    rng = random.Random()
    train, validation = split_rows(small_dataset, "train"), split_rows(small_dataset, "validation")
    total, common = 24, ("--checkpoint", tmp_path / "ckpt", "--loader", loader, "--steps", 24, "--global-batch", 8,
                         "--save-every", 3, "--seed", 5)
    kills = [rng.randrange(1, 6) for _ in range(3)]
    pieces = [run("resume_loop.py", small_dataset, *common, "--hosts", hosts, kill_after=kill)
              for hosts, kill in zip((4, 4, 2), kills, strict=True)]
    pieces.append(run("resume_loop.py", small_dataset, *common, "--hosts", 8))
    steps = effective_steps(pieces, total)
    assert all(len(s) == 8 for s in steps), kills
    stream = [s for step in steps for s in step]  # 192 records: three epochs of 63, and 3 of the fourth
    assert_epochs_exactly_once(stream, list(train))
    counts = np.bincount([train[s] for s in stream], minlength=3)
    assert pieces[-1].last("MODEL") == [str(c) for c in counts], kills  # the checkpoint held the step and the model
    assert sorted(pieces[-1].last("EVAL")) == sorted(validation)


def keras_steps(log, per_step: int) -> dict[int, list[str]]:
    """{step: fingerprints in stream order} of the steps a Keras piece trained whole (every replica logged its
    part; replica r trains the r-th consecutive batch of the step)."""
    found: dict[int, dict[int, list[str]]] = {}
    for line in log.read_text().splitlines() if log.exists() else []:
        words = line.replace("[", " ").replace("]", " ").split()
        if words[:1] == ["STEP"] and len(words) > 3:
            found.setdefault(int(words[1]), {})[int(words[2])] = words[3:]
    steps = {k: [f for r in sorted(parts) for f in parts[r]] for k, parts in found.items()}
    return {k: ids for k, ids in steps.items() if len(ids) == per_step}


def test_keras_killed_at_random_steps_resumes_with_backup_and_restore_on_8_devices(small_dataset, tmp_path):
    """BackupAndRestore(save_freq=2) restores the optimizer; its iterations are the start_step of the input."""
    import tensorflow as tf

    rng = random.Random()
    train = split_rows(small_dataset, "train")
    hashed = tf.strings.to_hash_bucket_fast(list(train), 2**62).numpy()
    fingerprint = {str(int(f)): s for s, f in zip(train, hashed, strict=True)}
    kills, pieces = [rng.randrange(1, 4) for _ in range(2)], []
    for i, kill in enumerate([*kills, None]):
        log = tmp_path / f"piece{i}.log"
        piece = run("resume_keras.py", small_dataset, "--backup", tmp_path / "backup", "--epochs", 4, "--log", log,
                    "--global-batch", 16, "--save-freq", 2, "--seed", 3, kill_after=kill, untuned=True)
        piece.steps = keras_steps(log, 16)
        pieces.append(piece)
    steps = effective_steps(pieces, 4 * (63 // 16))  # 12 steps of 16: two epochs of 63, and 18 of the third
    assert_epochs_exactly_once([fingerprint[f] for step in steps for f in step], list(train))
    evaluations = [line for piece in pieces for line in piece.lines if line.startswith("VAL ")]
    assert evaluations and set(evaluations) == {"VAL 17"}, kills  # each evaluation counted every record once
