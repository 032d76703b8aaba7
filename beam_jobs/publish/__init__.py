"""Finishing a build without Beam: check the shards and the accounting, then make the dataset visible.

Publishing is four steps, each safe to run twice or twice at once (Dataflow runs every step at least
once), the middle two in parallel over shards and splits:

    plan_publication (once)  the checks (planning failed? too many rejects?), the manifest to write, the moves
    clear_output (once)      the old manifest out, then files it named that the new dataset does not reuse
    move_shard (per shard)   the shard from the run's temporary folder to its name in the output
    merge_index (per split)  the split's index: a header, then each shard's index blocks in order
    commit (once)            reports, TFDS and Croissant metadata, the card README.md, and the manifest last;
                             temporary data removed, lock released

A reader starting from `manifest.json` never sees a partial dataset. An append (`append`) plans
differently and leaves the old manifest and every file it names alone until its new manifest replaces it.
A build that cannot publish leaves its reports in its temporary folder and fails with one line saying why.

By concern: `plan` (the plan and its checks), `assembly` (the manifest and the files derived from it),
`index_file` (a split's index), `steps` (the steps above), `append` (an append's plan). The names below are
re-exported here, the package's public surface.
"""
from __future__ import annotations

from beam_jobs.publish.assembly import build_manifest, described_files, named_files
from beam_jobs.publish.plan import IndexJob, Move, Publication, plan_publication
from beam_jobs.publish.steps import clear_output, commit, finish, merge_index, move_shard, publish_here

__all__ = ["IndexJob", "Move", "Publication", "plan_publication", "build_manifest", "described_files", "named_files",
           "clear_output", "move_shard", "merge_index", "commit", "finish", "publish_here"]
