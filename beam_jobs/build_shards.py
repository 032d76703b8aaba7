"""`python -m beam_jobs.build_shards ...` is `tpu-shards build ...`; the job lives in `beam_jobs.jobs.build`."""
from beam_jobs.jobs.build import main, run  # noqa: F401

__all__ = ["main", "run"]

if __name__ == "__main__":
    from beam_jobs.errors import exit_now

    exit_now(main())
