"""Flex Template entry point (FLEX_TEMPLATE_PYTHON_PY_FILE): the launcher runs this file with the
template's parameters as --name=value; beam_jobs.jobs.flex_launch rewrites them and runs build_shards.main."""
import logging
import sys

from beam_jobs.jobs.flex_launch import main

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)  # the launcher's console log then shows Beam's job submission
    sys.exit(main())
