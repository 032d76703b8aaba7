"""What every step of a job may know, below the steps: the settings (`config`), the run's identity (`identity`),
its claim on the output (`claim`), and its accounting (`tally`, `reports`, `failure`). Imports only
`shard_utils` and `beam_jobs.errors`; never Beam."""

__all__: list[str] = []
