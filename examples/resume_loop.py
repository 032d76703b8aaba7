"""A training loop that saves its step with its model and resumes exactly, on any number of hosts (JAX-style).

The data side of the JAX recipe in docs/resume.md, runnable without JAX: the "model" is a NumPy array (how many
records of each label it has trained on), and the hosts are simulated in this one process, each with its own
input pipeline, as `jax.process_count()` processes would be. Kill it at any moment (SIGKILL) and start it again,
with the same or another `--hosts`: it continues from its last checkpoint, and every record of every epoch is
trained on exactly once.

    python examples/resume_loop.py DATASET --checkpoint /tmp/ckpt --hosts 4 --steps 40 [--loader grain]

Prints `START k` (the step it resumes at), `STEP k <source ids>` after each step, `SAVED k` after each
checkpoint, then `EVAL <source ids>` (one exact pass over the validation split) and `MODEL <counts>`.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from shard_utils.manifest import load  # noqa: E402


def load_checkpoint(path: Path, num_classes: int) -> tuple[int, np.ndarray, dict | None]:
    """(step, model, Grain iterator state) from the last checkpoint, or a fresh start."""
    if not path.exists():
        return 0, np.zeros(num_classes), None
    with np.load(path) as saved:
        return int(saved["step"]), saved["model"], json.loads(str(saved["grain_state"])) or None


def save_checkpoint(path: Path, step: int, model: np.ndarray, grain_state: dict | None) -> None:
    """The step with the model (and Grain's state), atomically: a kill leaves the old checkpoint or the new one."""
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, step=step, model=model, grain_state=json.dumps(grain_state))
    os.replace(tmp, path)


def tf_hosts(dataset: str, hosts: int, global_batch: int, seed: int, step: int) -> list:
    """One tf.data iterator per host: its share of every global step from `step` on."""
    import tensorflow as tf

    from shard_utils import loader

    return [loader.make_dataset(dataset, "train", global_batch // hosts, seed=seed, start_step=step, as_dict=True,
                                input_context=tf.distribute.InputContext(hosts, h, hosts)).as_numpy_iterator()
            for h in range(hosts)]


def grain_hosts(dataset: str, hosts: int, global_batch: int, seed: int, state: dict | None) -> list:
    """One Grain iterator per host, restored from the saved iterator state (the step, whatever the host count)."""
    import grain

    from shard_utils.random_access import Decoder, RandomAccessSource
    from shard_utils.resume import grain_dataset

    src = RandomAccessSource(dataset, "train")
    iterators = []
    for h in range(hosts):
        ds = grain_dataset(src, seed=seed, global_batch_size=global_batch, process_index=h, process_count=hosts,
                           decode=Decoder.for_source(src))
        it = iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=4, prefetch_buffer_size=2)))
        if state is not None:
            it.set_state(state)
        iterators.append(it)
    return iterators


def evaluate(dataset: str, hosts: int, loader_name: str) -> list[str]:
    """Source ids of one exact evaluation pass over the validation split, all hosts together."""
    if loader_name == "grain":
        from shard_utils.random_access import Decoder, RandomAccessSource

        src = RandomAccessSource(dataset, "validation")
        decode = Decoder.for_source(src)
        return [decode(src[i])["source_id"] for h in range(hosts) for i in range(h, len(src), hosts)]
    import tensorflow as tf

    from shard_utils import loader

    seen = []
    for h in range(hosts):
        ds = loader.make_dataset(dataset, "validation", 2, training=False, repeat=False, as_dict=True,
                                 input_context=tf.distribute.InputContext(hosts, h, hosts))
        for batch in ds.as_numpy_iterator():
            seen += [s.decode() for s, w in zip(batch["source_id"], batch["weight"], strict=True) if w]
    return seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dataset")
    ap.add_argument("--checkpoint", required=True, help="folder of the checkpoint (created)")
    ap.add_argument("--hosts", type=int, default=1, help="simulated hosts, each with its own input pipeline")
    ap.add_argument("--loader", choices=("tf", "grain"), default="tf")
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=24, help="global steps of the whole run")
    ap.add_argument("--save-every", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    m = load(args.dataset)
    folder = Path(args.checkpoint)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "checkpoint.npz"
    step, model, grain_state = load_checkpoint(path, m.num_classes)
    print(f"START {step}", flush=True)
    hosts = (grain_hosts(args.dataset, args.hosts, args.global_batch, args.seed, grain_state)
             if args.loader == "grain" else tf_hosts(args.dataset, args.hosts, args.global_batch, args.seed, step))
    while step < args.steps:
        shares = [next(it) for it in hosts]  # with JAX: jax.make_array_from_process_local_data(sharding, share)
        labels = np.concatenate([s["label"] for s in shares])
        model = model + np.bincount(labels, minlength=m.num_classes)  # the "training step"
        ids = [s.decode() if isinstance(s, bytes) else str(s) for share in shares for s in share["source_id"]]
        print(f"STEP {step} {' '.join(ids)}", flush=True)
        step += 1
        if step % args.save_every == 0 or step == args.steps:
            save_checkpoint(path, step, model, hosts[0].get_state() if args.loader == "grain" else None)
            print(f"SAVED {step}", flush=True)
    print(f"EVAL {' '.join(evaluate(args.dataset, args.hosts, args.loader))}", flush=True)
    print(f"MODEL {' '.join(str(int(c)) for c in model)}", flush=True)


if __name__ == "__main__":
    main()
