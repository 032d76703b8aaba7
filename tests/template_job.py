"""The build as a template launch runs it: the run decided inside the job (no driver), on Beam's in-process runner.

    python tests/template_job.py INPUT OUTPUT LEASE_SECONDS

runs it in a process of its own (a test can kill it), with the output's lease as short as the test needs.
"""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import apache_beam as beam

from beam_jobs.jobs import options
from beam_jobs.jobs.build import build_pipeline
from beam_jobs.jobs.checks import prepare_inputs
from beam_jobs.run import claim
from beam_jobs.run.config import BuildConfig
from shard_utils.storage.lock import LEASE_SECONDS


def template_config(input_dir: Path, output: Path, lease_seconds: float = LEASE_SECONDS) -> BuildConfig:
    """The config a template launch builds its graph from: no run id, no creation time, not a local run."""
    args, _ = options.parse(["--input", str(input_dir), "--output", str(output), "--num-cores", "2"])
    listing, split_dirs = prepare_inputs(args)
    config = options.make_config(args, split_dirs, workers=1, temp_root=claim.temp_root_for(str(output), None),
                                 run_id=None, created=None, listing=listing, local=False)
    return replace(config, lease_seconds=lease_seconds)


def run_template_job(config: BuildConfig) -> None:
    """Build the template-mode graph and run it to the end on the in-process runner."""
    assert config.run_id is None
    p = beam.Pipeline(runner="FnApiRunner")
    build_pipeline(p, config)
    p.run().wait_until_finish()


if __name__ == "__main__":
    run_template_job(template_config(Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])))
