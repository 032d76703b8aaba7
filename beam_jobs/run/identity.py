"""A run's identity: its id, its temporary folder and when it was created, decided once per run."""
from __future__ import annotations

import datetime
import uuid
from dataclasses import dataclass

__all__ = ["RunInfo", "new_run_id"]


@dataclass(frozen=True)
class RunInfo:
    """What is decided once per run: its id, its temporary folder and when it was created.

    A driver decides it before submitting; a Dataflow template decides it at launch, inside the job,
    so that every launch of one template gets its own.
    """

    run_id: str
    temp_dir: str
    created: str


def new_run_id(now: datetime.datetime) -> str:
    """A run's id: its start time (sortable), then 8 random hex digits (runs started in the same second differ)."""
    return now.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:8]
