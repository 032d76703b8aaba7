"""Dataflow Flex Template metadata, generated from the job's own option parser so the two never drift.

    python -m beam_jobs.jobs.flex_metadata > dataflow/metadata.json

Parameters are named by the options' `dest` (``image_size``), the spelling Dataflow parameters and Beam
options use; ``beam_jobs.jobs.flex_launch`` turns the launcher's ``--image_size=224`` back into the job's
``--image-size=224``. Field names and types are the Dataflow API's ParameterMetadata, as described in
https://cloud.google.com/dataflow/docs/guides/templates/configuring-flex-templates (metadata section).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

__all__ = [
    "TEMPLATE_NAME", "DESCRIPTION", "GCS_PATH", "INTEGER", "NUMBER", "BOOLEAN", "GCS_TYPES", "FORMATS", "job_parser",
    "LOCAL_ONLY", "job_options", "is_flag", "long_option", "ACRONYMS", "parameter", "metadata", "render"
]

TEMPLATE_NAME = "tpu-shards build"
DESCRIPTION = ("Balanced, JPEG-encoded TFRecord shards for TPU cores, with a manifest.json, from a "
               "gs:// prefix of <label>/<image> files.")

GCS_PATH = r"^gs://[^\n\r]+$"
INTEGER = r"^[+-]?[0-9]+$"
NUMBER = r"^[+-]?([0-9]+([.][0-9]*)?|[.][0-9]+)([eE][+-]?[0-9]+)?$"
BOOLEAN = r"^(true|false)$"

# Options whose value is a path: a Flex Template job runs on Dataflow, so only gs:// makes sense there.
GCS_TYPES = {"input": "GCS_READ_FOLDER", "output": "GCS_WRITE_FOLDER"}
# Free-text options that still have a fixed shape (make_config checks the ranges).
FORMATS = {
    "image_size": r"^[0-9]+(,[0-9]+)?$",
    "background": r"^[0-9]+,[0-9]+,[0-9]+$",
    "tpu": r"^([vV][0-9]+[a-zA-Z]*|v5litepod)-[0-9]+$",
}


def job_parser() -> argparse.ArgumentParser:
    """The build job's option parser; the one place that says where it lives."""
    from beam_jobs.jobs.options import parser

    return parser()


LOCAL_ONLY = ("workers", "progress")  # options for local builds: a Flex launch runs on Dataflow


def job_options(ap: argparse.ArgumentParser) -> list[argparse.Action]:
    """The job's own documented options in declaration order (no --help, no internal test options, none
    that only local builds use)."""
    return [a for a in ap._actions if a.option_strings and not isinstance(a, argparse._HelpAction)
            and a.help != argparse.SUPPRESS and a.dest not in LOCAL_ONLY]


def is_flag(action: argparse.Action) -> bool:
    """Whether the option takes no value (store_true/store_false); other valueless actions are refused."""
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return True
    if action.nargs == 0:
        raise ValueError(f"option {action.option_strings[0]}: only store_true/store_false flags can be "
                         "Flex Template parameters")
    return False


def long_option(action: argparse.Action) -> str:
    """The option's first --long spelling, the one the job's messages use."""
    return next(s for s in action.option_strings if s.startswith("--"))


ACRONYMS = {"jpeg": "JPEG", "mb": "MB", "tpu": "TPU"}


def _label(dest: str) -> str:
    words = [ACRONYMS.get(w, w) for w in dest.split("_")]
    return " ".join([words[0][:1].upper() + words[0][1:], *words[1:]])


def _help(action: argparse.Action, ap: argparse.ArgumentParser) -> str:
    if not action.help or action.help == argparse.SUPPRESS:
        raise ValueError(f"option {long_option(action)} has no help text; Dataflow requires one")
    text = action.help
    if "%" in text:  # argparse's own expansion, e.g. %(default)s
        text = text % {**vars(action), "prog": ap.prog}
    return f"{text} (tpu-shards build {long_option(action)})"


def parameter(action: argparse.Action, ap: argparse.ArgumentParser) -> dict[str, Any]:
    """One ParameterMetadata entry for one option."""
    p: dict[str, Any] = {"name": action.dest, "label": _label(action.dest), "helpText": _help(action, ap),
                         "isOptional": not action.required}
    default = action.default
    if is_flag(action):
        p.update(regexes=[BOOLEAN], paramType="BOOLEAN",
                 defaultValue="true" if bool(default) else "false")
        return p
    if action.choices is not None:
        choices = [str(c) for c in action.choices]
        p.update(regexes=["^(" + "|".join(re.escape(c) for c in choices) + ")$"], paramType="ENUM",
                 enumOptions=[{"value": c, "label": c} for c in choices])
    elif action.dest in GCS_TYPES:
        p.update(regexes=[GCS_PATH], paramType=GCS_TYPES[action.dest])
    elif action.type is int:
        p.update(regexes=[INTEGER], paramType="NUMBER")
    elif action.type is float:
        p.update(regexes=[NUMBER], paramType="NUMBER")
    elif action.dest in FORMATS:
        p.update(regexes=[FORMATS[action.dest]], paramType="TEXT")
    else:
        p["paramType"] = "TEXT"
    if default is not None and default != argparse.SUPPRESS:
        p["defaultValue"] = str(default)
    return p


def metadata(ap: argparse.ArgumentParser | None = None) -> dict[str, Any]:
    """The whole metadata.json document for the job's parser."""
    ap = ap or job_parser()
    return {"name": TEMPLATE_NAME, "description": DESCRIPTION,
            "parameters": [parameter(a, ap) for a in job_options(ap)]}


def render(ap: argparse.ArgumentParser | None = None) -> str:
    """metadata.json's exact text (stable key order, trailing newline) so a diff shows any drift."""
    return json.dumps(metadata(ap), indent=2, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
