"""Public import path of `shard_utils.read.report`."""
from shard_utils.read.report import (
    CSP,
    FIRST_REJECTED,
    MANY_CLASSES,
    MAX_CLASSES,
    MAX_RECORDS,
    PER_CLASS,
    STYLE,
    TILE,
    Placed,
    RejectedRows,
    SplitSample,
    Tile,
    as_image,
    class_chart,
    contact_sheet,
    first_rejected,
    rejected_chart,
    render_page,
    render_sheet,
    sample_split,
    shard_chart,
    shown_classes,
    size_chart,
    thumbnail,
    write_report,
)

__all__ = [
    "PER_CLASS", "MAX_CLASSES", "MAX_RECORDS", "FIRST_REJECTED", "TILE", "MANY_CLASSES", "CSP", "STYLE", "Tile",
    "SplitSample", "shown_classes", "sample_split", "thumbnail", "Placed", "render_sheet", "contact_sheet",
    "class_chart", "shard_chart", "size_chart", "rejected_chart", "as_image", "RejectedRows", "first_rejected",
    "render_page", "write_report"
]
