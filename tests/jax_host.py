"""One JAX process of a multi-process run on this machine (CPU devices), training on `make_iterator`'s global batches
and saving the input state with Orbax; tests/test_jax_multihost.py starts several and kills them.

    python tests/jax_host.py DATASET --port P --processes N --process-id I --devices D --log FILE --ckpt DIR

Writes to FILE, one line each, flushed: `START k` (the step it resumed at), `STEP k row:fingerprint ...` (the rows of
global step k this process's devices hold), `SAVED k` after each checkpoint, and with `--eval`, `EVAL row:fp:mask
...` per evaluation batch. Process 0 also prints `STEP k` on stdout, for the test to time its kill.
"""
from __future__ import annotations

import argparse
import hashlib
import sys

import numpy as np


def fingerprints(array) -> list[str]:
    """row:fingerprint of each row of a global array this process holds (first device holding a row wins)."""
    seen: dict[int, str] = {}
    for shard in array.addressable_shards:
        data = np.asarray(shard.data)
        for i in range(len(data)):
            seen.setdefault(shard.index[0].start + i, fingerprint(data[i]))
    return [f"{r}:{seen[r]}" for r in sorted(seen)]


def fingerprint(image: np.ndarray) -> str:
    return hashlib.sha1(np.ascontiguousarray(image, dtype=np.float32).tobytes()).hexdigest()[:16]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dataset")
    for name in ("port", "processes", "process-id", "devices", "global-batch", "steps", "save-every", "seed"):
        ap.add_argument(f"--{name}", type=int, default=0)
    ap.add_argument("--log", required=True)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--eval", action="store_true")
    args = ap.parse_args()

    import jax

    jax.config.update("jax_num_cpu_devices", args.devices)
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{args.port}", num_processes=args.processes,
                               process_id=args.process_id, initialization_timeout=120)
    import orbax.checkpoint as ocp

    from shard_utils.jax_loader import make_iterator

    assert jax.process_count() == args.processes and jax.device_count() == args.processes * args.devices
    log = open(args.log, "a", buffering=1)
    mngr = ocp.CheckpointManager(args.ckpt, options=ocp.CheckpointManagerOptions(
        save_interval_steps=args.save_every, max_to_keep=2))
    it = make_iterator(args.dataset, "train", args.global_batch, seed=args.seed)
    if mngr.latest_step() is not None:
        it.set_state(mngr.restore(mngr.latest_step(), args=ocp.args.Composite(data=ocp.args.JsonRestore()))["data"])
    print(f"START {it.step}", file=log)
    while it.step < args.steps:
        step = it.step
        batch = next(it)
        print(f"STEP {step} {' '.join(fingerprints(batch['image']))}", file=log)
        if args.process_id == 0:
            print(f"STEP {step}", flush=True)
        if mngr.save(it.step, args=ocp.args.Composite(data=ocp.args.JsonSave(it.get_state()))):
            mngr.wait_until_finished()
            print(f"SAVED {it.step}", file=log)
    mngr.wait_until_finished()
    if args.eval:
        for batch in make_iterator(args.dataset, "validation", args.global_batch, training=False):
            marks = {int(s.index[0].start + i): float(m)
                     for s in batch["mask"].addressable_shards for i, m in enumerate(np.asarray(s.data))}
            rows = [f"{f}:{marks[int(f.split(':')[0])]:g}" for f in fingerprints(batch["image"])]
            print(f"EVAL {' '.join(rows)}", file=log)
    print("DONE", file=log)
    mngr.close()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
