"""tpu-shards Beam jobs and the `tpu-shards` command line."""
