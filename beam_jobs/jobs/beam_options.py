"""Beam's options for a job, with each view made once: Beam asks the pipeline's options for a view about four
times per transform, and every new view builds and runs an argparse parser of its own."""
from __future__ import annotations

from typing import Any, TypeVar

from apache_beam.options.pipeline_options import PipelineOptions

__all__ = ["View", "JobOptions"]

View = TypeVar("View", bound=PipelineOptions)


class JobOptions(PipelineOptions):
    """PipelineOptions whose views are cached per class. A view keeps no state of its own (every view reads and
    writes the one shared `_all_options`), so handing back the same view is what a new one would do."""

    def view_as(self, cls: type[View]) -> View:
        views = self.__dict__.setdefault("_views", {})
        view = views.get(cls)
        if view is None:
            view = views[cls] = super().view_as(cls)
        return view

    def __getstate__(self) -> dict[str, Any]:
        """Copies and pickles carry the options, not the views (they would point at the old options)."""
        state = super().__getstate__()
        return {key: value for key, value in state.items() if key != "_views"}
