"""The pieces of benchmarks/bench_build.py: test images, baselines, timed child processes, profiles, tables."""
